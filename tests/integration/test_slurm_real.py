"""Items as jobs on a real Slurm: a lane through ``--executor slurm`` on the single-node Slurm that
``.ci/slurm-up`` starts on loopback (slurmctld, slurmd, and slurmdbd for the accounting submitit reads
job states from), one job of the cell's array killed with ``scancel --signal=KILL`` mid-item.

The run must give every planned item exactly one record; the killed item an INFRA attempt
(``NodeLost``) that names the node, then a record from its retry; every outcome equal to a local
run's; and ``sacct`` must know the run's jobs. Skipped where no Slurm answers with an idle node."""

from __future__ import annotations

import json
import re
import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest

from tests.support.cluster_runs import harness_run, item_key, outcomes, records

pytestmark = pytest.mark.integration

#: Four quick items of the current releases (the same selection as test_executors_real.py).
SLURM_COMMANDS = ("sinfo", "squeue", "scancel", "sacct")
#: How long a started job is given to match its marker before the first running job is killed anyway.
MATCH_GRACE_S = 10


def _slurm(*args: str, timeout: float = 30) -> str:
    return subprocess.run(args, capture_output=True, text=True, timeout=timeout, check=True).stdout


def no_slurm_reason() -> str | None:
    """Why the real-Slurm test cannot run here, or None."""
    missing = [c for c in SLURM_COMMANDS if shutil.which(c) is None]
    if missing:
        return f"{', '.join(missing)} not on PATH: no Slurm here (.ci/slurm-up starts one)"
    try:
        nodes = [line.split() for line in _slurm("sinfo", "-h", "-N", "-o", "%N %t", timeout=20).splitlines()]
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as exc:
        return f"sinfo does not answer ({type(exc).__name__}): Slurm is not running (.ci/slurm-up starts it)"
    if not any(state == "idle" for _, state in (n for n in nodes if len(n) == 2)):
        return f"no idle Slurm node in sinfo ({', '.join(' '.join(n) for n in nodes) or 'no nodes'})"
    return None


@pytest.fixture(scope="module")
def slurm() -> None:
    reason = no_slurm_reason()
    if reason:
        pytest.skip(reason)


@pytest.fixture(scope="module")
def local_outcomes(slurm: None, tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, str, str], str]:
    out = tmp_path_factory.mktemp("local") / "out"
    proc = harness_run(out)
    log, _ = proc.communicate(timeout=900)
    assert proc.returncode == 0, log[-3000:]
    return outcomes(records(out))


def own_job_ids(folder: Path) -> set[str]:
    """The run's Slurm jobs, from submitit's folder: one directory per job (``7``, ``7_0``, ``10``)."""
    if not folder.exists():
        return set()
    return {d.name for d in folder.iterdir() if d.is_dir() and re.fullmatch(r"\d+(_\d+)?", d.name)}


def running_jobs(folder: Path) -> list[tuple[str, str]]:
    """The run's running jobs as (``%i``, ``%A``): ``7_1`` and ``8`` for a task of array 7."""
    own = {name.split("_")[0] for name in own_job_ids(folder)}
    rows = [line.split() for line in _slurm("squeue", "-h", "-t", "R", "-o", "%i %A %F").splitlines()]
    return [(row[0], row[1]) for row in rows if len(row) == 3 and (row[2] in own or row[1] in own)]


def names_job(text: str, job: tuple[str, str]) -> bool:
    return any(re.search(rf"\bjob {re.escape(jid)}(?![\d_])", text) for jid in job)


def kill_a_job_mid_item(proc: subprocess.Popen[str], out: Path, deadline: float) -> tuple[str, Path | None]:
    """Waits for a job of the run that is RUNNING with its item started (its marker written, naming
    the job where the node text does), kills it, and returns its id and marker."""
    folder = out / "slurm"
    markers = folder / "nodes"
    first_seen: float | None = None
    while time.monotonic() < deadline and proc.poll() is None:
        started = {m: m.read_text() for m in sorted(markers.glob("*"))} if markers.exists() else {}
        started = {m: text for m, text in started.items() if text}
        running = running_jobs(folder) if started else []
        if running:
            first_seen = first_seen or time.monotonic()
            for job in running:
                for marker, text in started.items():
                    if names_job(text, job):
                        subprocess.run(["scancel", "--signal=KILL", job[0]], check=True, timeout=30)
                        return job[0], marker
            if time.monotonic() - first_seen > MATCH_GRACE_S:
                # No node text names its job: the item of the first running job has had time to start.
                subprocess.run(["scancel", "--signal=KILL", running[0][0]], check=True, timeout=30)
                return running[0][0], None
        time.sleep(0.2)
    raise AssertionError("no job of the run was ever running with its item started")


def sacct_job_ids(ids: set[str]) -> set[str]:
    text = _slurm("sacct", "-n", "-X", "-P", "-o", "JobID", "-j", ",".join(sorted(ids)))
    return {line.strip() for line in text.splitlines() if line.strip()}


def test_a_lane_on_a_real_slurm_survives_a_job_killed_mid_item(
    slurm: None, tmp_path: Path, local_outcomes: dict[tuple[str, str, str], str]
) -> None:
    out = tmp_path / "slurm"
    proc = harness_run(out, "--executor", "slurm", "--slurm-param", "timeout_min=30")
    try:
        deadline = time.monotonic() + 900
        killed_job, killed_marker = kill_a_job_mid_item(proc, out, deadline)
        log, _ = proc.communicate(timeout=max(60, deadline - time.monotonic()))
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, log[-3000:]

    found = records(out)
    keys = [item_key(r) for r in found]
    assert sorted(keys) == sorted(local_outcomes), "every planned item has exactly one record"
    assert len(set(keys)) == len(keys)
    lost = [r for r in found if any(a.get("error_type") == "NodeLost" for a in r.get("attempts", []))]
    assert lost, f"the item of job {killed_job} was run again, its lost attempt kept"
    if killed_marker is not None:  # its name starts with the item's label (cell__repro__mode.)
        killed = [r for r in found if killed_marker.name.startswith("__".join(item_key(r)) + ".")]
        assert killed and all(r in lost for r in killed), (killed_marker.name, [item_key(r) for r in lost])
    host = socket.gethostname()
    for record in lost:
        first = record["attempts"][0]
        assert first["outcome"] == "INFRA", first
        assert first["error_type"] == "NodeLost", first
        assert host in first["message"], first["message"]
        assert any("run again after its node was lost" in reason for reason in record["reasons"])
    assert outcomes(found) == local_outcomes, "outcomes equal a local run's"

    concurrency = json.loads((out / "run.json").read_text())["concurrency"]
    assert concurrency["executor"] == "slurm"
    assert concurrency["cluster"] == "slurm"
    assert concurrency["lost"] >= 1
    assert concurrency["jobs_submitted"] >= len(keys) + 1, "one job per item, and the killed item's retry"

    # Accounting (what submitit reads job states from) knows the run's jobs: the cell's array and the retry.
    ids = own_job_ids(out / "slurm")
    assert ids, "submitit's folder has the run's jobs"
    known: set[str] = set()
    for _ in range(60):
        known = sacct_job_ids(ids)
        if len(known) >= concurrency["jobs_submitted"]:
            break
        time.sleep(0.5)
    assert len(known) >= concurrency["jobs_submitted"], (sorted(known), sorted(ids))
    assert any("_" in job for job in known), f"the cell's items went in as a job array: {sorted(known)}"
    assert killed_job in known, (killed_job, sorted(known))
