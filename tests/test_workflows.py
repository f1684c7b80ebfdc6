"""The GitHub Actions workflows: valid against GitHub's workflow schema (the copy
check-jsonschema vendors; actionlint too where it is installed), their shell steps
parse, every `python -m harness` command in them parses with the harness's own CLI,
and they do what the nightly and per-push jobs must do."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from harness.analysis.atlas.issues import issue_title
from harness.cli.main import parser as _parser
from tests.support.paths import REPO_ROOT

WORKFLOWS = REPO_ROOT / ".github" / "workflows"
NIGHTLY = WORKFLOWS / "nightly.yml"
CI = WORKFLOWS / "ci.yml"


def load(path: Path) -> dict[str, Any]:
    data = yaml.safe_load(path.read_text())
    # YAML 1.1 reads the key `on` as True.
    data["on"] = data.pop(True, data.get("on"))
    return data


def steps(workflow: dict[str, Any]) -> list[dict[str, Any]]:
    return [step for job in workflow["jobs"].values() for step in job.get("steps", [])]


def scripts(workflow: dict[str, Any]) -> list[str]:
    return [step["run"] for step in steps(workflow) if "run" in step]


def schema_check(*paths: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "check_jsonschema", "--builtin-schema", "vendor.github-workflows", *map(str, paths)],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_workflows_are_valid_github_workflows() -> None:
    proc = schema_check(NIGHTLY, CI)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_the_schema_check_can_fail(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yml"
    bad.write_text(
        "on: push\njobs:\n  x:\n    runs-on: ubuntu-latest\n    steps:\n      - uses: a/b@v1\n        rnu: echo\n"
    )
    assert schema_check(bad).returncode != 0


#: actionlint as ``make setup`` installs it where npm is (rhysd/actionlint 1.7.7 built to WebAssembly; it
#: checks the workflows of the directory it runs in).
NODE_ACTIONLINT = REPO_ROOT / ".tools" / "node_modules" / "@tktco" / "node-actionlint" / "bin" / "node-actionlint.js"


def actionlint() -> list[str] | None:
    if shutil.which("actionlint"):
        return ["actionlint", str(NIGHTLY), str(CI)]
    if NODE_ACTIONLINT.is_file() and shutil.which("node"):
        return ["node", str(NODE_ACTIONLINT)]
    return None


@pytest.mark.skipif(actionlint() is None, reason="actionlint is not installed (make setup installs it where npm is)")
def test_actionlint_finds_nothing() -> None:
    command = actionlint()
    assert command is not None
    proc = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def _as_shell(script: str) -> str:
    """The script with each ${{ expression }} replaced by a word, as the runner would."""
    return re.sub(r"\$\{\{.*?\}\}", "EXPR", script)


@pytest.mark.parametrize("path", [NIGHTLY, CI], ids=lambda p: p.name)
def test_every_shell_step_parses(path: Path) -> None:
    for script in scripts(load(path)):
        proc = subprocess.run(["bash", "-n"], input=_as_shell(script), capture_output=True, text=True)
        assert proc.returncode == 0, f"{script}\n{proc.stderr}"


def harness_commands(workflow: dict[str, Any]) -> list[list[str]]:
    found = []
    for script in scripts(workflow):
        joined = script.replace("\\\n", " ")
        for line in joined.splitlines():
            # "$@": arguments the script gathered before (the atlas's sources), each a --from DIR.
            words = [w for w in shlex.split(_as_shell(line), comments=True) if w != "$@"]
            if "harness" in words and "-m" in words:
                args = words[words.index("harness") + 1 :]
                found.append(args[: args.index("||")] if "||" in args else args)
    return found


def test_every_harness_command_in_the_nightly_job_parses() -> None:
    commands = harness_commands(load(NIGHTLY))
    assert {c[0] for c in commands} >= {"run", "merge", "report", "compare", "watch", "atlas"}
    parser = _parser()
    for command in commands:
        parser.parse_args([w.replace('"', "") for w in command])


def test_the_nightly_job_shards_merges_compares_and_reports() -> None:
    workflow = load(NIGHTLY)
    assert "schedule" in workflow["on"] and "workflow_dispatch" in workflow["on"]
    jobs = workflow["jobs"]
    shard = jobs["shard"]
    assert "vars.GPU_RUNNER_LABEL" in shard["runs-on"]
    assert shard["strategy"]["fail-fast"] is False and "matrix.shard" not in shard["strategy"]["matrix"]
    run_shard = next(s["run"] for s in shard["steps"] if "--shard" in s.get("run", ""))
    assert '--shard "$SHARD"' in run_shard and "--reports-dir previous" in run_shard
    assert 'if [ "$rc" -gt 1 ]' in run_shard  # a mismatch alone does not fail the shard
    uploads = [s for s in shard["steps"] if str(s.get("uses", "")).startswith("actions/upload-artifact")]
    assert uploads and "strategy.job-index" in uploads[0]["with"]["name"]

    merge = jobs["merge"]
    assert set(merge["needs"]) == {"plan", "shard"} and "!cancelled()" in merge["if"]
    text = "\n".join(scripts({"jobs": {"merge": merge}}))
    assert "harness merge merged shards/*/" in text
    assert "harness compare previous/merged merged --markdown summary.md" in text
    assert '>> "$GITHUB_STEP_SUMMARY"' in text and 'exit "$rc"' in text
    names = {s.get("with", {}).get("name") for s in merge["steps"] if "upload-artifact" in str(s.get("uses"))}
    assert {"nightly-merged", "nightly-report"} <= names
    previous = "\n".join(scripts({"jobs": {"plan": jobs["plan"]}}))
    assert "gh run download" in previous and "--name nightly-merged" in previous
    assert workflow["permissions"]["actions"] == "read"  # no secret: the job's own token reads artifacts


def test_the_push_job_runs_what_ci_runs() -> None:
    workflow = load(CI)
    assert "push" in workflow["on"] and "pull_request" in workflow["on"]
    (job,) = workflow["jobs"].values()
    assert job["runs-on"] == "ubuntu-latest"
    assert "bash .ci/run" in scripts(workflow)


def test_ci_prints_the_15_slowest_tests() -> None:
    """What the suite spends its time on is in every CI log: .ci/run runs `make test`, whose pytest
    prints the 15 slowest tests."""
    assert (REPO_ROOT / ".ci" / "run").read_text().rstrip().splitlines()[-1] == "make test"
    planned = subprocess.run(["make", "-n", "test"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=60)
    (command,) = [line for line in planned.stdout.splitlines() if "-m pytest" in line]
    assert "--durations=15" in shlex.split(command)


def test_the_watch_job_runs_the_watch_lane_on_a_hosted_cpu_runner_against_the_previous_night() -> None:
    workflow = load(NIGHTLY)
    watch = workflow["jobs"]["watch"]
    assert watch["runs-on"] == "ubuntu-latest" and "needs" not in watch  # beside the GPU job, not after it
    text = "\n".join(scripts({"jobs": {"watch": watch}}))
    assert "harness watch --lane watch --previous previous --out tonight" in text
    assert "--name watch-night --dir previous" in text and 'exit "$rc"' in text
    assert watch["env"]["PIP_EXTRA_INDEX_URL"].startswith("https://download.pytorch.org/whl/cpu")
    assert float(watch["env"]["FT_REGRESS_CACHE_MAX_GB"]) < 14  # a hosted runner's free disk
    upload = next(s for s in watch["steps"] if "upload-artifact" in str(s.get("uses")))
    assert upload["with"]["name"] == "watch-night" and "tonight/changes.json" in upload["with"]["path"]
    assert "!cancelled()" in upload["if"]  # a night that regressed is still tomorrow's previous night


def test_the_atlas_job_builds_on_both_nights_and_the_previous_atlas_and_publishes_it() -> None:
    workflow = load(NIGHTLY)
    jobs = workflow["jobs"]
    atlas = jobs["atlas"]
    assert set(atlas["needs"]) == {"merge", "watch"} and "!cancelled()" in atlas["if"]  # a regressed night counts
    downloads = {s["with"]["name"]: s for s in atlas["steps"] if "download-artifact" in str(s.get("uses"))}
    assert set(downloads) == {"nightly-merged", "watch-night"}
    assert all(s.get("continue-on-error") for s in downloads.values())  # a night that left none still builds
    text = "\n".join(scripts({"jobs": {"atlas": atlas}}))
    assert "--name compatibility-atlas --dir previous-atlas" in text and '"$run_id" != "$GITHUB_RUN_ID"' in text
    assert 'set -- "$@" --from "$dir"' in text and "harness atlas build --out atlas" in text
    upload = next(s for s in atlas["steps"] if "upload-artifact" in str(s.get("uses")))
    assert upload["with"]["name"] == "compatibility-atlas" and upload["with"]["path"] == "atlas"
    pages = jobs["atlas-pages"]
    assert pages["needs"] == "atlas" and "vars.ATLAS_PAGES == 'true'" in pages["if"]
    assert pages["permissions"] == {"pages": "write", "id-token": "write"}
    assert [s.get("uses", "").split("@")[0] for s in pages["steps"]] == [
        "actions/download-artifact",
        "actions/upload-pages-artifact",
        "actions/deploy-pages",
    ]


def test_the_atlas_job_opens_or_updates_one_issue_per_culprit() -> None:
    atlas = load(NIGHTLY)["jobs"]["atlas"]
    assert atlas["permissions"]["issues"] == "write" and atlas["permissions"]["contents"] == "read"
    step = next(s for s in atlas["steps"] if "gh issue" in s.get("run", ""))
    script = step["run"]
    assert "for file in atlas/issues/*.md" in script and 'title=$(head -n 1 "$file")' in script
    assert "select(.title == $title)" in script  # the same culprit's open issue, by its exact title
    assert "gh issue comment" in script and "gh issue create" in script
    # The title a night's culprit gets is the atlas's own.
    assert issue_title("deepspeed", "0.20.0") == "nightly regression introduced by deepspeed==0.20.0"
