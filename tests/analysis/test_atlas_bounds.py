"""The atlas answers no further than its proofs (issue 50, class 1): a range is proven between the releases it was
observed at, a failure only at the world sizes its SPEC says it can occur at, a claim only on the device its
evidence ran on; a requirements file's markers are evaluated for this platform."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from harness.analysis.atlas.build import assemble
from harness.analysis.atlas.check import AFFECTED, NOT_AFFECTED, UNKNOWN
from harness.analysis.atlas.evidence import read_sources
from harness.analysis.atlas.model import Claim
from harness.analysis.atlas.regions import Where, inside, within_observed
from harness.core.errors import EXIT_NOTHING_CHECKED
from tests.analysis.test_atlas import CURRENT, DISCOVERY, answers, ci_run
from tests.support.paths import REPO_ROOT
from tests.support.report_fixture import VERSIONS_NEW, _record

PROVEN = "torch==2.13.0 peft==0.21.2 transformers==5.23.0"


def atlas_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "harness", "atlas", "check", *args],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def lines_of(done: subprocess.CompletedProcess[str]) -> dict[str, str]:
    return {line.split(" ", 1)[0]: line for line in done.stdout.splitlines()}


# -- observed releases, not the whole specifier ------------------------------------------------------------------


@pytest.mark.parametrize("deepspeed", ["99.0", "0.20.0.dev0", "0.1.0", "0.19.1"])
@pytest.mark.parametrize("device", [None, "cpu", "cuda"])
def test_a_release_no_run_observed_is_neither_affected_nor_free_of_f1(deepspeed: str, device: str | None) -> None:
    verdict, why = answers(f"{PROVEN} deepspeed=={deepspeed}", device=device)["F1"]
    assert verdict == UNKNOWN, why
    if device == "cpu":
        assert f"deepspeed {deepspeed} in " in why and "beyond what was observed there" in why


def test_the_bar_deepspeed_99_is_not_answered_for_f1_either_way() -> None:
    done = atlas_cli("--stack", f"{PROVEN} deepspeed==99.0", "--repros", "F1", "--device", "cpu")
    assert lines_of(done)["F1"].startswith("F1 unknown: "), done.stdout + done.stderr
    assert "(0.19.3, 0.19.8)" in lines_of(done)["F1"] and "--prove --repros F1" in lines_of(done)["F1"]
    assert done.returncode == EXIT_NOTHING_CHECKED and "nothing was answered" in done.stderr


def test_the_releases_a_range_was_observed_at_are_answered() -> None:
    for deepspeed, expected in (("0.19.2", AFFECTED), ("0.19.3", NOT_AFFECTED), ("0.19.5", NOT_AFFECTED)):
        assert answers(f"{PROVEN} deepspeed=={deepspeed}", device="cpu")["F1"][0] == expected, deepspeed


@pytest.mark.parametrize(
    ("observed", "version", "holds"),
    [
        (["0.19.0", "0.19.3"], "0.19.1", False),  # the hole at 0.19.2 lies between the two observations
        (["0.19.0", "0.19.1", "0.19.3"], "0.19.1", True),
        (["0.18.0", "0.19.0"], "0.18.5", True),
        (["0.18.0", "0.19.0"], "0.19.0.post1", False),
        (["0.19.3", "0.19.8"], "0.19.8+local", True),
        ([], "0.19.3", False),
    ],
)
def test_a_range_with_a_hole_is_proven_stretch_by_stretch(observed: list[str], version: str, holds: bool) -> None:
    assert within_observed("!=0.19.2", observed, version) is holds


def test_runs_that_agree_with_a_range_widen_what_it_answers_for(tmp_path: Path) -> None:
    newer = {**VERSIONS_NEW, "deepspeed": "0.20.1"}
    run = ci_run(tmp_path / "ci", [_record("ds-0.20.1", "F1", "bug", "NOT_REPRODUCED", versions=newer)])
    atlas = assemble(DISCOVERY, read_sources([run], DISCOVERY))
    between = CURRENT.replace("deepspeed==0.19.8", "deepspeed==0.20.0")
    assert answers(between, device="cpu")["F1"][0] == UNKNOWN  # the catalog alone: beyond 0.19.8
    assert answers(between, atlas, device="cpu")["F1"][0] == NOT_AFFECTED  # between 0.19.8 and the run's 0.20.1
    beyond = CURRENT.replace("deepspeed==0.19.8", "deepspeed==0.21.0")
    assert answers(beyond, atlas, device="cpu")["F1"][0] == UNKNOWN


def test_a_run_inside_the_written_range_that_saw_otherwise_still_contradicts_it() -> None:
    claim = Claim(outcome="NOT_REPRODUCED", when={"deepspeed": ">=0.19.3"}, observed={"deepspeed": ["0.19.3"]},
                  under=[{}], device="cpu", source="catalog")  # fmt: skip
    far = Where(versions={"deepspeed": "0.30.0"}, complete=True, device="cpu")
    assert not inside(claim, far, ["deepspeed"]) and inside(claim, far, ["deepspeed"], spans=False)


# -- the SPEC's world sizes ---------------------------------------------------------------------------------------


def test_the_bar_f12_at_world_size_1_is_not_called_affected() -> None:
    done = atlas_cli("--stack", f"{PROVEN} deepspeed==0.19.2", "--repros", "F12", "--world-size", "1")
    line = lines_of(done)["F12"]
    assert line.startswith("F12 not affected: it cannot occur at world size 1 (only >=2): with one rank"), line
    two = answers(f"{PROVEN} deepspeed==0.19.2", device="cpu", world_size=2)["F12"]
    assert two[0] == AFFECTED


@pytest.mark.parametrize("size", ["0", "-1"])
def test_a_world_size_that_launches_no_rank_is_refused(size: str) -> None:
    done = atlas_cli("--stack", CURRENT, "--world-size", size)
    assert done.returncode == 2 and "--world-size takes a whole number (1 or more)" in done.stderr, done.stderr


# -- the evidence's device ----------------------------------------------------------------------------------------


def test_a_cuda_stack_is_never_called_free_of_anything_on_cpu_evidence() -> None:
    done = atlas_cli("--stack", CURRENT.replace("torch==2.13.0", "torch==2.13.0+cu130"), "--device", "cuda")
    said = lines_of(done)
    assert said and not [line for line in said.values() if line.split(": ", 1)[0].endswith(" not affected")]
    assert "proven on cpu, not cuda" in said["F1"]


def test_every_claim_of_the_catalog_records_its_device_and_its_observed_releases() -> None:
    atlas = assemble(DISCOVERY, read_sources([], DISCOVERY))
    for entry in atlas.failures:
        for claim in entry.claims:
            assert claim.device in ("cpu", "cuda"), (entry.id, claim.when)
            for package in claim.when:
                assert claim.observed.get(package), f"{entry.id} {claim.outcome} {claim.when}: nothing observed"


# -- a requirements file's markers --------------------------------------------------------------------------------


def test_the_bar_the_markers_file_is_not_called_free_of_f1(tmp_path: Path) -> None:
    lock = tmp_path / "requirements.txt"
    lock.write_text(
        "torch==2.13.0\npeft==0.21.2\ntransformers==5.23.0\n"
        'deepspeed==0.19.2 ; sys_platform == "linux"\ndeepspeed==0.19.8 ; sys_platform == "darwin"\n'
    )
    done = atlas_cli("--requirements", str(lock), "--repros", "F1,F12,F13,F17", "--device", "cpu")
    said = lines_of(done)
    assert all(not said[f].startswith(f"{f} not affected") for f in ("F1", "F12", "F13", "F17")), done.stdout
    if sys.platform == "linux":  # deepspeed 0.19.2, as a Linux machine installs it
        assert said["F1"].startswith("F1 affected: ") and done.returncode == 1
