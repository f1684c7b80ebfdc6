"""The survey of real stacks (issue 49): the data and where each stack came from, ``atlas survey --list`` and its
slices, the fewest environments its questions need, and where two surveyed stacks disagree."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

from harness.analysis.atlas.build import assemble
from harness.analysis.atlas.check import AFFECTED, NOT_AFFECTED, check_stack, where_of
from harness.analysis.atlas.evidence import read_sources
from harness.analysis.atlas.regions import contains
from harness.analysis.atlas.survey import default_survey_path, in_survey_order, load_survey, slice_of
from harness.analysis.atlas.survey_plan import disagreements, environments, questions, runnable_on, torch_builds
from harness.core.errors import UserError
from harness.environments.stacks import parse_stack_text
from repros.catalog._surveyed import ANSWERS_TOO, SLICE, SURVEYED
from tests.analysis.test_atlas import DISCOVERY, cli
from tests.support.report_fixture import _record, write_run

PEERS = (
    "axolotl-ai-cloud/axolotl",
    "hiyouga/LLaMA-Factory",
    "OpenRLHF/OpenRLHF",
    "huggingface/trl",
    "modelscope/ms-swift",
)


def survey_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return cli("survey", *args)


# -- the data -----------------------------------------------------------------------------------------------------


def test_the_survey_holds_real_stacks_each_with_where_it_came_from() -> None:
    stacks = load_survey()
    assert len(stacks) >= 12
    for stack in stacks:
        source = stack.source
        assert source.repository and source.ref and source.file and len(source.date) == 10, stack.id
        if stack.kind == "release":
            assert source.commit and len(source.commit) == 40 and source.url, stack.id  # a tag, at its commit
        assert "torch" in stack.stack.versions, stack.id  # every stack says which torch it runs
    repositories = {s.source.repository for s in stacks}
    assert set(PEERS) <= repositories and "allenai/open-instruct" in repositories
    years = {s.source.date[:4] for s in stacks}
    assert {"2024", "2025", "2026"} <= years
    (issue,) = [s for s in stacks if s.id == "trl-2514"]
    assert issue.text() == (
        "torch==2.5.1 deepspeed==0.15.3 transformers==4.46.3 peft==0.14.0 accelerate==1.0.1 trl==0.12.2"
    )


def test_a_stack_that_pins_only_some_packages_says_the_day_it_was_resolved_as_of() -> None:
    for stack in load_survey():
        pinned = all("==" in line for line in stack.requires) and set(stack.stack.versions) <= {
            line.split("==")[0] for line in stack.requires
        }
        assert pinned or stack.resolved_as_of == stack.source.date, stack.id


def _survey(tmp_path: Path, change: dict[str, object], index: int = 0) -> Path:
    data = yaml.safe_load(default_survey_path().read_text())
    data["stacks"][index].update(change)
    path = tmp_path / "survey.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"stack": {"torch": "2.5.1", "deepspeed": "0.15.2", "transformers": "4.46.3", "peft": "0.14.0",
                    "accelerate": "1.0.1", "trl": "0.12.2"}},
         "stacks[0] (trl-2514).requires[1]: stack's deepspeed 0.15.2 does not satisfy 'deepspeed==0.15.3'"),
        ({"requires": ["torch>=2.0", "deepspeed==0.15.3"]}, "stacks[0] (trl-2514).resolved_as_of: is missing"),
        ({"requires": ["torch==2.5.1 ; sys_platform == 'win32'"]}, "does not hold on this platform"),
        ({"colour": "red"}, "Additional properties are not allowed ('colour' was unexpected)"),
        ({"stack": {"torch": 2.5}}, "stacks.0.stack.torch: 2.5 is not of type 'string'"),
    ],
)  # fmt: skip
def test_a_survey_that_contradicts_itself_is_refused_naming_the_stack(
    tmp_path: Path, change: dict[str, object], words: str
) -> None:
    path = _survey(tmp_path, change)
    with pytest.raises(UserError) as raised:
        load_survey(path)
    assert raised.value.line().startswith(str(path)) and words in raised.value.line(), raised.value.line()


def test_two_stacks_with_one_id_are_refused(tmp_path: Path) -> None:
    path = _survey(tmp_path, {"id": "trl-v0.12.0"})
    with pytest.raises(UserError, match="'trl-v0.12.0' is the id of an earlier stack"):
        load_survey(path)


# -- --list and --slice ------------------------------------------------------------------------------------------


def test_list_prints_each_stack_as_a_stack_string_and_nothing_else() -> None:
    done = survey_cli("--list")
    assert done.returncode == 0 and done.stderr == ""
    lines = done.stdout.splitlines()
    stacks = in_survey_order(load_survey())
    assert lines == [s.text() for s in stacks]
    for line in lines:
        assert parse_stack_text(line).versions  # each one --stack takes back


def test_the_slices_split_the_survey_without_overlap_in_torchs_order() -> None:
    everything = [s.text() for s in in_survey_order(load_survey())]
    parts = [survey_cli("--list", "--slice", f"{i}/3").stdout.splitlines() for i in (1, 2, 3)]
    assert [line for part in parts for line in part] == everything
    assert all(parts)
    assert slice_of(load_survey(), 1, 1) == in_survey_order(load_survey())
    bad = survey_cli("--list", "--slice", "4/3")
    assert bad.returncode == 2 and "--slice: 4/3: shard 4 of 3 does not exist" in bad.stderr


# -- the plan: fewest environments ---------------------------------------------------------------------------------


def _unproven_survey(tmp_path: Path) -> Path:
    """A survey of stacks nothing was proven for (torch 2.2 and 2.3: older than every surveyed stack); two differ
    in trl alone, which decides none of F1, F5, F7, F8."""
    data = yaml.safe_load(default_survey_path().read_text())
    (trl_2514,) = [s for s in data["stacks"] if s["id"] == "trl-2514"]
    stacks = []
    moved = [
        ("2.3.1", "0.14.2", "0.12.2"),
        ("2.3.1", "0.14.4", "0.12.2"),
        ("2.3.1", "0.14.4", "0.12.1"),
        ("2.2.2", "0.14.0", "0.12.2"),
    ]
    for n, (torch, deepspeed, trl) in enumerate(moved):
        stack = {**trl_2514["stack"], "torch": torch, "deepspeed": deepspeed, "trl": trl}
        requires = [f"{p}=={v}" for p, v in stack.items()]
        stacks.append({**trl_2514, "id": f"unproven-{n}", "requires": requires, "stack": stack})
    path = tmp_path / "survey.yaml"
    path.write_text(yaml.safe_dump({**data, "stacks": stacks}))
    return path


def test_stacks_that_share_what_decides_a_failure_share_its_environment(tmp_path: Path) -> None:
    atlas = assemble(DISCOVERY, read_sources([], DISCOVERY))
    stacks = load_survey(_unproven_survey(tmp_path))
    failures = ["F1", "F5", "F7", "F8"]
    asked = questions(atlas, DISCOVERY, stacks, failures, "cpu")
    plan = environments(asked, in_survey_order(stacks), DISCOVERY)
    # Every question answered by some environment, and fewer environments than stacks: F8 depends on torch alone.
    answered = {(s, f) for env in plan for s in env.answers_for for f in env.failures}
    assert {(q.stack.id, q.failure) for q in asked} <= answered
    assert len(plan) < len(stacks)
    f8 = [env for env in plan if "F8" in env.failures]
    torch_of = {env.stack.stack.versions["torch"].split("+")[0] for env in f8}
    assert len(f8) == len(torch_of)  # one F8 run per torch release
    assert torch_builds(plan) == sorted(torch_builds(plan), key=lambda v: tuple(int(x) for x in v.split(".")))


def test_a_failure_only_a_gpu_shows_is_not_asked_of_a_cpu() -> None:
    assert runnable_on(DISCOVERY.repros["F1"].spec, "cpu")
    assert not runnable_on(DISCOVERY.repros["F19"].spec, "cpu") and runnable_on(DISCOVERY.repros["F19"].spec, "cuda")


def test_plan_runs_nothing_and_says_what_it_would_build(tmp_path: Path) -> None:
    survey = _unproven_survey(tmp_path)
    done = survey_cli("--plan", "--repros", "F8", "--survey", str(survey), "--out", str(tmp_path / "survey"))
    assert done.returncode == 0, done.stderr
    assert "2 environments to build and run; torch 2.2.2, 2.3.1" in done.stdout and "runs F8" in done.stdout
    assert not (tmp_path / "survey" / "runs").exists()


# -- disagreements -------------------------------------------------------------------------------------------------


def _point_run(directory: Path, versions: dict[str, str], outcome: str, repro: str = "F5") -> Path:
    record = _record("stack", repro, "bug", outcome)
    record["versions"] = {"python": "3.11.7", **versions}
    return write_run(directory, "RUN", "2026-11-29T00:00:00+00:00", [record])


def test_two_surveyed_stacks_that_disagree_name_the_packages_that_moved(tmp_path: Path) -> None:
    stacks = {s.id: s for s in load_survey()}
    old, new = stacks["open-instruct-v0.1.0"], stacks["open-instruct-v0.3.0"]
    runs = [
        _point_run(tmp_path / "old", {"torch": "2.9.0", "deepspeed": "0.18.4", "transformers": "4.57.6"}, "REPRODUCED"),
        _point_run(
            tmp_path / "new", {"torch": "2.10.0", "deepspeed": "0.18.4", "transformers": "5.4.0"}, "NOT_REPRODUCED"
        ),
    ]
    atlas = assemble(DISCOVERY, read_sources(runs, DISCOVERY))
    (found,) = [d for d in disagreements(atlas, DISCOVERY, [old, new], ["F5"], "cpu")]
    assert (found.affected.id, found.clean.id) == (old.id, new.id)
    assert dict(found.moved) == {"torch": ("2.9.0", "2.10.0"), "transformers": ("4.57.6", "5.4.0")}
    assert AFFECTED != NOT_AFFECTED


def test_the_catalogs_surveyed_stacks_are_the_surveys_own_in_their_slices() -> None:
    survey = load_survey()
    stacks = {s.id: s for s in survey}
    for stack_id, pins in SURVEYED.items():
        assert stack_id in stacks, stack_id
        assert stacks[stack_id] in slice_of(survey, SLICE[stack_id], 8), stack_id
        for package, spec in pins.items():
            assert contains(spec, stacks[stack_id].stack.versions[package]), (stack_id, package)
    for stack_id, others in ANSWERS_TOO.items():
        for other in others:
            assert all(contains(spec, stacks[other].stack.versions[p]) for p, spec in SURVEYED[stack_id].items())


def test_an_unknown_surveyed_stack_says_the_command_that_proves_it_as_a_stack(tmp_path: Path) -> None:
    atlas = assemble(DISCOVERY, read_sources([], DISCOVERY))
    stack = load_survey(_unproven_survey(tmp_path))[0]
    (found,) = check_stack(atlas, DISCOVERY, stack.stack, where_of(stack.stack, "cpu", None, None), ["F1"])
    assert found.verdict == "unknown"
    assert f"prove it: python -m harness atlas check --stack '{stack.stack.text()}' --prove --repros F1" in found.why
