"""The compatibility atlas: ``atlas build`` and ``atlas check`` as a user meets them, from the catalog's SPECs and
run directories shaped as runs, bisects and watch nights write them."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from packaging.utils import canonicalize_name

from harness.analysis.atlas.build import assemble
from harness.analysis.atlas.check import AFFECTED, NOT_AFFECTED, UNKNOWN, answer, check_stack, exit_status, where_of
from harness.analysis.atlas.evidence import read_sources
from harness.analysis.atlas.issues import issue_title
from harness.analysis.atlas.model import AtlasFile, read_atlas
from harness.analysis.atlas.regions import Where, contains
from harness.cli.main import main
from harness.config.repros import discover
from harness.core.errors import EXIT_NOTHING_CHECKED
from harness.environments.stacks import parse_stack_text
from harness.records.changes import Change, Culprit, write_changes
from repros.runtime.outcomes import Outcome
from tests.support.paths import REPO_ROOT
from tests.support.report_fixture import VERSIONS_NEW, _record, write_run

TRL_2514 = "torch==2.5.1 deepspeed==0.15.3 transformers==4.46.3 peft==0.14.0 accelerate==1.0.1"
CURRENT = "torch==2.13.0 deepspeed==0.19.8 peft==0.21.2 transformers==5.23.0 accelerate==1.15.0 bitsandbytes==0.50.2"
DISCOVERY = discover()


def answers(stack: str, atlas: AtlasFile | None = None, **where: Any) -> dict[str, tuple[str, str]]:
    parsed = parse_stack_text(stack)
    atlas = atlas or assemble(DISCOVERY, read_sources([], DISCOVERY))
    place = where_of(parsed, where.get("device"), where.get("world_size"), where.get("family"))
    return {a.failure: (a.verdict, a.why) for a in check_stack(atlas, DISCOVERY, parsed, place)}


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "harness", "atlas", *args],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


# -- the bar ------------------------------------------------------------------------------------------------------


def test_trl_2514s_stack_is_affected_by_f1_from_its_run_under_torch_2_5_and_nothing_beyond_what_was_observed(
    tmp_path: Path,
) -> None:
    done = cli("check", "--stack", TRL_2514, "--atlas", str(tmp_path / "none"), "--device", "cpu")
    lines = {line.split(" ", 1)[0]: line for line in done.stdout.splitlines()}
    assert set(lines) == set(DISCOVERY.repros)  # one line per documented failure, starting with its id
    # The survey's run of the stack itself (a CUDA build of torch 2.5.1 on a CPU), as the catalog keeps it.
    assert lines["F1"].startswith(
        "F1 affected: REPRODUCED where torch==2.5.1, deepspeed==0.15.3, peft==0.14.0, transformers==4.46.3 on cpu "
        "[catalog 2026-11-29: python -m harness atlas survey --slice 3/8"
    ), lines["F1"]
    assert "trl-2514: torch==2.5.1" in lines["F1"]
    assert all(lines[f].startswith(f"{f} affected: ") for f in ("F5", "F7", "F8"))
    assert done.returncode == 1, done.stdout + done.stderr
    # A release next to it that nothing ran: unknown, with the command that would prove it.
    near = cli("check", "--stack", TRL_2514.replace("0.15.3", "0.15.2"), "--repros", "F1", "--device", "cpu")
    assert near.stdout.startswith("F1 unknown: ") and "--prove --repros F1" in near.stdout, near.stdout
    assert near.returncode == EXIT_NOTHING_CHECKED


def test_the_current_stack_is_free_of_f1_and_affected_by_f8() -> None:
    found = answers(CURRENT, device="cpu")
    assert found["F1"][0] == NOT_AFFECTED and "deepspeed 0.19.8 in >=0.19.3 (observed 0.19.3, 0.19.8)" in found["F1"][1]
    assert found["F8"][0] == AFFECTED
    assert "fsdp1-use-orig-params" in found["F8"][1] and "it costs:" in found["F8"][1]  # the guard, what it costs
    assert found["F4"][0] == AFFECTED  # open upstream
    assert exit_status([]) == 0


def test_nothing_outside_a_proven_range_is_called_affected_or_not() -> None:
    # deepspeed 0.19.2 is in F1's bad range, but transformers 4.46.3 is outside every stack it was proven under.
    found = answers("torch==2.13.0 deepspeed==0.19.2 peft==0.21.2 transformers==4.46.3", device="cpu")
    assert found["F1"][0] == UNKNOWN and "transformers 4.46.3 (proven: ==5.23.0)" in found["F1"][1]
    # ... and the same deepspeed under the stack the range was proven on is affected.
    proven = "torch==2.13.0 deepspeed==0.19.2 peft==0.21.2 transformers==5.23.0"
    assert answers(proven, device="cpu")["F1"][0] == AFFECTED
    # A package the stack does not name is not guessed.
    assert "names no deepspeed" in answers("torch==2.13.0 peft==0.21.2 transformers==5.23.0")["F1"][1]


def test_a_package_a_failure_does_not_depend_on_is_not_held_to_anything() -> None:
    # F8 is torch's own check: whatever transformers and peft, the torch it was observed at has it.
    found = answers("torch==2.13.0 transformers==4.30.0 peft==0.5.0", device="cpu")
    assert found["F8"][0] == AFFECTED


def test_a_family_the_failure_cannot_occur_in_is_not_affected() -> None:
    found = answers("torch==2.13.0 deepspeed==0.19.2 peft==0.21.2 transformers==5.23.0", family="gemma2")
    assert found["F1"][0] == NOT_AFFECTED and "cannot occur in gemma2" in found["F1"][1]
    assert answers(CURRENT, family="phi3")["F33"][0] == AFFECTED


def test_a_failure_proven_on_one_device_answers_for_that_device() -> None:
    # F17 (the gloo gather race) is proven on CPU runs only.
    stack = "torch==2.13.0 deepspeed==0.19.2 peft==0.21.2 transformers==5.23.0"
    assert answers(stack)["F17"][0] == AFFECTED and "(on cpu; on cuda: unknown" in answers(stack)["F17"][1]
    assert answers(stack, device="cuda")["F17"][0] == UNKNOWN
    assert answers(stack, device="cpu")["F17"][0] == AFFECTED


# -- the catalog's data: every failure's claims answer for the cells that established them ------------------------


def test_every_documented_failure_says_what_decides_it_and_where_its_ranges_were_proven() -> None:
    for repro_id, repro in DISCOVERY.repros.items():
        spec = repro.spec
        assert spec.depends_on and spec.depends_on_why, repro_id
        for e in spec.expectations:
            if e.mode == "bug" and e.outcome in (Outcome.REPRODUCED, Outcome.NOT_REPRODUCED):
                assert e.under, f"{repro_id}: {e.outcome} {dict(e.when)} records no stack it was proven under"


def test_each_cell_a_range_was_established_in_is_answered_as_that_range_says() -> None:
    # A stack of ``under`` that lies in the range (a cell that ran it) gets the range's answer: no other claim of
    # the same failure says otherwise there (two ranges that overlap leave it "the proofs disagree").
    atlas = assemble(DISCOVERY, read_sources([], DISCOVERY))
    checked = 0
    for repro_id, repro in DISCOVERY.repros.items():
        entry = atlas.failure(repro_id)
        assert entry is not None
        for e in repro.spec.expectations:
            if e.mode != "bug" or e.outcome not in (Outcome.REPRODUCED, Outcome.NOT_REPRODUCED):
                continue
            for under in e.under:
                versions = {canonicalize_name(p): s[2:] for p, s in under.items()}
                if not all(contains(s, versions.get(canonicalize_name(p))) for p, s in e.when.items()):
                    continue  # the range names a package this stack holds elsewhere (a boundary's other side)
                where = Where(versions=versions, complete=True, device=e.device or "cpu")
                found = answer(repro.spec, entry, where, "prove")
                expected = AFFECTED if e.outcome == Outcome.REPRODUCED else NOT_AFFECTED
                assert found.verdict == expected, f"{repro_id} under {dict(under)}: {found.line()}"
                checked += 1
    assert checked >= 80  # every failure's cells (89 on 2026-11-27)


def test_the_newer_paths_answer_where_their_cells_ran_and_nowhere_else() -> None:
    stack = CURRENT.replace("peft==0.21.2", "peft==0.20.0")
    assert (
        answers(stack, device="cpu")["F29"][0] == AFFECTED
        and "peft 0.20.0 in >=0.17.0,<0.21.0" in answers(stack, device="cpu")["F29"][1]
    )
    assert answers(CURRENT, device="cpu")["F29"][0] == NOT_AFFECTED
    # The same peft under a transformers F29 was never run with is not guessed.
    verdict, why = answers(stack.replace("transformers==5.23.0", "transformers==5.1.0"), device="cpu")["F29"]
    assert verdict == UNKNOWN and "transformers 5.1.0 (proven: ==5.23.0)" in why
    # DeepSpeed 0.18.3: F26 still there (fixed in 0.18.4), F27 already fixed (in 0.18.2).
    sp = CURRENT.replace("deepspeed==0.19.8", "deepspeed==0.18.3")
    assert (answers(sp, device="cpu")["F26"][0], answers(sp, device="cpu")["F27"][0]) == (AFFECTED, NOT_AFFECTED)
    assert answers(CURRENT.replace("transformers==5.23.0", "transformers==5.1.0"), device="cpu")["F32"][0] == AFFECTED
    assert answers(CURRENT + " trl==1.6.0", device="cpu")["F31"][0] == AFFECTED
    assert answers(CURRENT + " trl==1.7.0", device="cpu")["F31"][0] == NOT_AFFECTED
    assert answers(CURRENT, device="cpu")["F31"][0] == UNKNOWN  # no trl named: nothing to say
    torchao = CURRENT.replace("peft==0.21.2", "peft==0.18.1") + " torchao==0.18.0"
    assert answers(torchao, device="cpu")["F30"][0] == AFFECTED
    assert answers(CURRENT + " torchao==0.18.0", device="cpu")["F30"][0] == NOT_AFFECTED


@pytest.mark.parametrize("failure", ["F24", "F25", "F28"])
def test_a_cuda_only_failure_is_never_free_of_it_on_cpu_evidence(failure: str) -> None:
    # Their only proof is a CPU run's INFRA: on a GPU nothing is known, and nothing is ever called not affected.
    stacks = [CURRENT, CURRENT.replace("accelerate==1.15.0", "accelerate==1.12.0"), CURRENT + " trl==1.6.0"]
    for stack in stacks:
        for device in (None, "cpu", "cuda"):
            assert answers(stack, device=device)[failure][0] == UNKNOWN, (stack, device)
        assert "proven on cpu, not cuda" in answers(stack, device="cuda")[failure][1]
    verdict, why = answers(CURRENT)["F24"]
    assert "INFRA" in why and "on cuda: nothing proven; --device asks for one" in why


# -- evidence from runs -------------------------------------------------------------------------------------------


def ci_run(directory: Path, extra: Sequence[dict[str, Any]] = ()) -> Path:
    recs = [
        _record("ds-0.19.2", "F1", "bug", "REPRODUCED", signature="F1.recompute-shape-0"),
        _record("current", "F1", "bug", "NOT_REPRODUCED"),
        _record("current", "F8", "bug", "REPRODUCED", signature="F8.uniform-requires-grad"),
        *extra,
    ]
    return write_run(directory, "run-ci", "2026-11-27T02:47:08+00:00", recs)


def test_atlas_build_covers_every_failure_with_f1s_boundary_and_its_evidence(tmp_path: Path) -> None:
    run = ci_run(tmp_path / "ci")
    assert main(["atlas", "build", "--out", str(tmp_path / "atlas"), "--from", str(run)]) == 0
    atlas = read_atlas(tmp_path / "atlas" / "atlas.json")
    assert len(atlas.failures) >= 23 and atlas.sources == ["catalog", str(run)]
    f1 = atlas.failure("F1")
    assert f1 is not None and f1.depends_on == ["torch", "deepspeed", "peft", "transformers"]
    (boundary,) = [b for b in f1.boundaries if b.under.get("transformers") == "==5.23.0"]
    assert (boundary.package, boundary.kind, boundary.last_bad, boundary.first_good) == (
        "deepspeed",
        "fixed",
        "0.19.2",
        "0.19.3",
    )
    assert boundary.status == "proven" and boundary.under["torch"] == "==2.13.0"
    commands = {e.command for e in boundary.evidence}
    assert any("--cells ds-0.19.2 --repros F1" in c for c in commands)  # the run that observed 0.19.2 bad
    assert any(e.source == "catalog" and e.date == "2026-11-22" for e in boundary.evidence)
    observed = next(e for e in boundary.evidence if e.source == "run")
    assert observed.outcome == "REPRODUCED" and observed.versions["deepspeed"] == "0.19.2"
    # F8 is open upstream: its last release known bad is the one the run saw.
    f8 = atlas.failure("F8")
    assert f8 is not None
    assert any(b.status == "open upstream" and b.last_bad == "2.13.0" for b in f8.boundaries)


def test_the_newer_paths_draw_the_boundaries_their_bisects_found(tmp_path: Path) -> None:
    def seen(cell: str, repro: str, outcome: str, **changed: str) -> dict[str, Any]:
        return _record(cell, repro, "bug", outcome, versions={**VERSIONS_NEW, **changed})

    run = ci_run(
        tmp_path / "nightly",
        [
            seen("sp-ds-0.18.3", "F26", "REPRODUCED", deepspeed="0.18.3"),
            seen("peft-0.20.0", "F29", "REPRODUCED", peft="0.20.0"),
            seen("tf-5.1.0", "F32", "REPRODUCED", transformers="5.1.0"),
        ],
    )
    atlas = assemble(DISCOVERY, read_sources([run], DISCOVERY))
    assert len(atlas.failures) == len(DISCOVERY.repros) == 37

    def fixed(failure: str, package: str) -> tuple[str | None, str | None]:
        entry = atlas.failure(failure)
        assert entry is not None
        (found,) = [b for b in entry.boundaries if b.package == package and b.kind == "fixed"]
        assert found.status == "proven" and found.under["torch"] == "==2.13.0"
        return found.last_bad, found.first_good

    assert fixed("F26", "deepspeed") == ("0.18.3", "0.18.4")
    assert fixed("F29", "peft") == ("0.20.0", "0.21.0")
    assert fixed("F32", "transformers") == ("5.1.0", "5.2.0")
    assert fixed("F31", "trl") == (None, "1.7.0")  # no run of trl 1.6.0 given: the last bad is not guessed


def test_the_page_is_self_contained_and_shows_boundaries_by_package(tmp_path: Path) -> None:
    main(["atlas", "build", "--out", str(tmp_path / "atlas"), "--from", str(ci_run(tmp_path / "ci"))])
    page = (tmp_path / "atlas" / "index.html").read_text()
    assert "<svg" in page and 'id="pkg-deepspeed"' in page and 'id="F33"' in page
    assert "last bad 0.19.2 → first good 0.19.3" in page
    assert not re.search(r"""(src|href)=["']https?:""", page)  # nothing fetched


def test_a_later_run_that_saw_otherwise_contradicts_the_range_and_is_shown_not_replaced(tmp_path: Path) -> None:
    against = _record("ds-0.19.5", "F1", "bug", "REPRODUCED", versions={**VERSIONS_NEW, "deepspeed": "0.19.5"})
    run = ci_run(tmp_path / "ci", [against])
    atlas = assemble(DISCOVERY, read_sources([run], DISCOVERY))
    f1 = atlas.failure("F1")
    assert f1 is not None
    contradicted = [b for b in f1.boundaries if b.status == "contradicted"]
    assert contradicted and all(b.contradicted_by[0].versions["deepspeed"] == "0.19.5" for b in contradicted)
    assert any(b.first_good == "0.19.3" for b in contradicted)  # still there, marked
    # The stack the run observed is affected (what it saw); another in the contradicted range is unknown.
    assert answers(CURRENT.replace("0.19.8", "0.19.5"), atlas)["F1"][0] == AFFECTED
    verdict, why = answers(CURRENT.replace("0.19.8", "0.19.6"), atlas)["F1"]
    assert verdict == UNKNOWN and "contradicted by run" in why


def bisect_dir(directory: Path) -> Path:
    """A bisect of F1 over deepspeed 0.19.2 .. 0.19.3 in the current stack, as ``bisect`` writes it."""
    steps = [
        _record("ds-0.19.2@0.19.2", "F1", "bug", "REPRODUCED", signature="F1.recompute-shape-0", bisect_point="0.19.2",
                versions={**VERSIONS_NEW, "deepspeed": "0.19.2"}),
        _record("ds-0.19.2@0.19.3", "F1", "bug", "NOT_REPRODUCED", bisect_point="0.19.3",
                versions={**VERSIONS_NEW, "deepspeed": "0.19.3"}),
    ]  # fmt: skip
    write_run(directory, "run-bisect", "2026-11-27T03:30:00+00:00", steps)
    step = {"role": "endpoint", "seconds": 1.0, "environment": "reused", "env_key": None, "error": None}
    report = {
        "run_id": "run-bisect", "repro": "F1", "mode": "bug", "axis": "version", "package": "deepspeed",
        "good": "0.19.3", "bad": "0.19.2", "points": ["0.19.2", "0.19.3"], "kind": "fix", "status": "found",
        "boundary": "0.19.3", "candidates": ["0.19.3"], "skipped": [], "failed_differently": [],
        "steps": [
            {**step, "n": 1, "point": "0.19.2", "outcome": "REPRODUCED", "signature": "F1.recompute-shape-0",
             "state": "bad"},
            {**step, "n": 2, "point": "0.19.3", "outcome": "NOT_REPRODUCED", "signature": None, "state": "good"},
        ],
        "environments_built": 0, "wall_s": 2.0, "final": "first good: deepspeed==0.19.3",
        "directory": str(directory), "base_cell": "ds-0.19.2", "matrix": "matrix.yaml",
        "bad_signature": ["REPRODUCED", "F1.recompute-shape-0"],
    }  # fmt: skip
    (directory / "bisect.json").write_text(json.dumps(report))
    return directory


def test_a_bisect_proves_its_boundary_with_its_command(tmp_path: Path) -> None:
    atlas = assemble(DISCOVERY, read_sources([bisect_dir(tmp_path / "bisect")], DISCOVERY))
    f1 = atlas.failure("F1")
    assert f1 is not None
    (found,) = [b for b in f1.boundaries if b.source == "bisect"]
    assert (found.kind, found.last_bad, found.first_good, found.status) == ("fixed", "0.19.2", "0.19.3", "proven")
    assert found.under["transformers"] == "==5.23.0" and found.under["device"] == "cpu"
    (evidence,) = found.evidence
    assert evidence.outcome == "first good: deepspeed==0.19.3"
    assert "bisect --repro F1 --mode bug --package deepspeed --good 0.19.3 --bad 0.19.2" in evidence.command


def watch_night(directory: Path) -> Path:
    """A watch night whose F1 regressed with deepspeed 0.20.0 (watch named it), as ``watch`` writes it."""
    after = _record(
        "latest",
        "F1",
        "bug",
        "REPRODUCED",
        signature="F1.recompute-shape-0",
        versions={**VERSIONS_NEW, "deepspeed": "0.20.0"},
    )
    write_run(directory, "night-2", "2026-11-28T02:17:00+00:00", [after])
    change = Change(
        cell="latest",
        repro="F1",
        mode="bug",
        before="NOT_REPRODUCED",
        after="REPRODUCED",
        moved={"deepspeed": ("0.19.8", "0.20.0")},
        verdict="regressed",
        culprit=Culprit(package="deepspeed", last="0.19.8", first="0.20.0"),
        reason="deepspeed 0.19.8 is the last release with the old outcome, 0.20.0 the first with the new",
        after_signature="F1.recompute-shape-0",
        evidence={"bisect": str(directory / "watch" / "absent"), "final": "first bad: deepspeed==0.20.0"},
    )
    write_changes(directory, [change])
    return directory


def test_a_culprit_watch_named_goes_into_the_atlas_and_opens_one_issue(tmp_path: Path) -> None:
    night = watch_night(tmp_path / "night")
    assert main(["atlas", "build", "--out", str(tmp_path / "atlas"), "--from", str(night)]) == 0
    atlas = read_atlas(tmp_path / "atlas" / "atlas.json")
    f1 = atlas.failure("F1")
    assert f1 is not None
    (found,) = [b for b in f1.boundaries if b.source == "watch"]
    assert (found.kind, found.last_good, found.first_bad) == ("introduced", "0.19.8", "0.20.0")
    # The catalog's "fixed from 0.19.3" is contradicted by the night, not replaced by it.
    assert any(b.source == "catalog" and b.status == "contradicted" for b in f1.boundaries)
    assert answers(CURRENT.replace("0.19.8", "0.20.0"), atlas)["F1"][0] == AFFECTED
    # Watch proved 0.19.8 still good, on the night's CPU runner; on a GPU the contradicted range says nothing.
    assert answers(CURRENT, atlas, device="cpu")["F1"][0] == NOT_AFFECTED
    assert answers(CURRENT, atlas, device="cuda")["F1"][0] == UNKNOWN
    (issue,) = (tmp_path / "atlas" / "issues").glob("*.md")
    title, blank, *body = issue.read_text().splitlines()
    assert title == issue_title("deepspeed", "0.20.0") == "nightly regression introduced by deepspeed==0.20.0"
    assert blank == "" and any("latest/F1/bug" in line for line in body)


def test_an_atlas_keeps_its_evidence_when_built_again_from_itself(tmp_path: Path) -> None:
    main(["atlas", "build", "--out", str(tmp_path / "a1"), "--from", str(watch_night(tmp_path / "night"))])
    main(["atlas", "build", "--out", str(tmp_path / "a2"), "--from", str(tmp_path / "a1")])
    f1 = read_atlas(tmp_path / "a2" / "atlas.json").failure("F1")
    assert f1 is not None and any(b.source == "watch" and b.first_bad == "0.20.0" for b in f1.boundaries)


#: Like OpenRLHF v0.6.0's stack (which the catalog holds), with a DeepSpeed nothing was proven at.
TORCH_2_6_DS_0_16_2 = {
    "torch": "2.6.0",
    "deepspeed": "0.16.2",
    "transformers": "4.48.3",
    "peft": "0.14.0",
    "accelerate": "1.4.0",
}


def test_a_stack_that_does_not_import_is_unknown_saying_so_and_not_run_again(tmp_path: Path) -> None:
    # DeepSpeed 0.16 with triton 3.2 does not import on a CPU (DeepSpeed#7028).
    broken = (
        "rank 1: deepspeed does not import in this cell: RuntimeError: 0 active drivers ([]). There should only be one."
    )
    versions = {**VERSIONS_NEW, **TORCH_2_6_DS_0_16_2}
    timed_out = {**versions, "peft": "0.15.0"}
    run = write_run(
        tmp_path / "survey",
        "run-survey",
        "2026-11-29T04:06:06+00:00",
        [
            _record("stack", "F1", "bug", "INFRA", versions=versions, reasons=[broken]),
            _record("other", "F1", "bug", "INFRA", versions=timed_out, reasons=["building the environment timed out"]),
        ],
    )
    atlas = assemble(DISCOVERY, read_sources([run], DISCOVERY))
    stack = " ".join(f"{p}=={v}" for p, v in TORCH_2_6_DS_0_16_2.items())
    (found,) = check_stack(
        atlas, DISCOVERY, parse_stack_text(stack), where_of(parse_stack_text(stack), "cpu", None, None), ["F1"]
    )
    assert found.verdict == UNKNOWN and found.why.startswith("it cannot run here: INFRA observed on this stack")
    assert "deepspeed does not import in this cell: RuntimeError: 0 active drivers" in found.why
    assert not found.provable and "prove it" not in found.why  # the survey does not run it again on a CPU
    # An INFRA that says nothing of the stack (a build that timed out) is no answer: a run could still settle it.
    other = parse_stack_text(stack.replace("peft==0.14.0", "peft==0.15.0"))
    (again,) = check_stack(atlas, DISCOVERY, other, where_of(other, "cpu", None, None), ["F1"])
    assert again.verdict == UNKNOWN and again.provable and "prove it" in again.why


# -- usage errors ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["check", "--stack", "torch>=2.5"], "--stack: torch>=2.5: is not an exact pin"),
        (["check", "--stack", "torch==2.5.1 torch==2.6.0"], "names torch twice"),
        (["check", "--requirements", "/nonexistent/uv.lock"], "/nonexistent/uv.lock: --requirements: no such file"),
        (["check", "--stack", "torch==2.5.1", "--repros", "F999"], "--repros: F999: unknown repro"),
        (["check", "--stack", "torch==2.5.1", "--from", "/nonexistent"], "--from: /nonexistent: is not a directory"),
        (["check"], "one of the arguments --stack --requirements --here is required"),
        (["build"], "the following arguments are required: --out"),
    ],
)
def test_a_usage_error_is_one_line_and_exit_2(args: list[str], words: str) -> None:
    done = cli(*args)
    assert done.returncode == 2 and done.stdout == ""
    assert len(done.stderr.strip().splitlines()) == 1 and words in done.stderr, done.stderr


def test_a_requirements_line_that_is_not_a_pin_is_named_with_its_line(tmp_path: Path) -> None:
    lock = tmp_path / "requirements.txt"
    lock.write_text("# pinned\ntorch==2.13.0\npeft>=0.14\n")
    done = cli("check", "--requirements", str(lock))
    assert done.returncode == 2 and f"{lock}: line 3: 'peft>=0.14' is not a pinned version" in done.stderr


def test_a_uv_lock_is_read_as_the_stack_it_installs(tmp_path: Path) -> None:
    lock = tmp_path / "uv.lock"
    packages = [("torch", "2.13.0"), ("deepspeed", "0.19.8"), ("peft", "0.21.2"), ("transformers", "5.23.0")]
    lock.write_text(
        'version = 1\nrequires-python = ">=3.11"\n\n[[package]]\nname = "my-trainer"\nsource = { editable = "." }\n'
        + "".join(f'\n[[package]]\nname = "{n}"\nversion = "{v}"\nsource = {{ registry = "x" }}\n' for n, v in packages)
    )
    done = cli("check", "--requirements", str(lock), "--repros", "F1,F8", "--device", "cpu")
    assert done.returncode == 1, done.stderr
    assert done.stdout.splitlines()[0].startswith("F1 not affected: ")


def test_a_surveyed_stack_is_a_point_that_draws_no_boundary() -> None:
    # The survey's expectations pin every package F1 depends on: F1's only boundaries are its bisect's, deepspeed's.
    atlas = assemble(DISCOVERY, read_sources([], DISCOVERY))
    f1 = atlas.failure("F1")
    assert f1 is not None
    assert {(b.package, b.kind, b.first_good) for b in f1.boundaries} == {("deepspeed", "fixed", "0.19.3")}
