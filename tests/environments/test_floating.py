"""Floating cells: a spec that is not an exact pin resolves afresh each run to a lock (now, or as
of a day), and the environment is keyed by that lock, so a new release is seen the first night it
is out and an unchanged resolution reuses last night's environment."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from harness.config.matrix import load_matrix
from harness.core.errors import UserError
from harness.environments import EnvironmentUnavailable, EnvRequest, UvEnvironments
from harness.environments.index import IndexConfig, pip_index_config
from harness.environments.locks import Lock, ReleaseDates, resolve_lock
from harness.environments.specs import NEWEST, floating, is_exact, requirement
from harness.environments.uv import LOCK_FILE, UvProvider, find_uv
from repros.runtime.spec import MODES


@pytest.mark.parametrize(
    "spec, exact",
    [
        ("==0.19.2", True),
        ("===0.19.2", True),
        ("==0.19.*", False),
        (">=0.19,<0.20", False),
        ("~=0.19.2", False),
        ("!=0.19.2", False),
        ("==0.19.2,!=0.19.3", False),
        (NEWEST, False),
    ],
)
def test_only_a_pin_naming_one_release_is_exact(spec: str, exact: bool) -> None:
    assert is_exact(spec) is exact


def test_the_newest_release_is_asked_for_by_name_alone() -> None:
    assert requirement("peft", NEWEST) == "peft" and requirement("peft", ">=0.15") == "peft>=0.15"
    assert floating({"torch": "==2.13.0", "peft": "*", "deepspeed": "~=0.19.2"}) == ["deepspeed", "peft"]


MATRIX = """
version: 1
lanes: {watch: ""}
defaults:
  packages: {torch: "==2.13.0", peft: "==0.15.0"}
cells:
  latest:
    packages: {peft: "*"}
    lanes: [watch]
  next:
    packages: {peft: ">=0.15"}
    prerelease: true
    lanes: [watch]
"""


def load(tmp_path: Path, text: str = MATRIX):
    path = tmp_path / "m.yaml"
    path.write_text(textwrap.dedent(text))
    return load_matrix(path, known_repros=("F9",), known_modes=MODES)


def test_a_matrix_may_ask_for_the_newest_release_or_a_range(tmp_path: Path) -> None:
    cells = load(tmp_path).cells
    assert cells["latest"].floating == ["peft"] and cells["latest"].packages["torch"] == "==2.13.0"
    assert cells["next"].prerelease and not cells["latest"].prerelease


def test_an_empty_spec_is_refused_naming_the_newest_release_as_a_fix(tmp_path: Path) -> None:
    with pytest.raises(UserError) as info:
        load(tmp_path, MATRIX.replace('{peft: "*"}', '{peft: ""}'))
    assert info.value.field == "cells.latest.packages.peft" and "'*'" in info.value.fix


FAKE_UV = """\
import json, os, sys
args = sys.argv[1:]
with open(os.environ["FAKE_UV_LOG"], "a") as log:
    log.write(json.dumps({"args": args, "stdin": sys.stdin.read()}) + "\\n")
cut = "--exclude-newer" in args
exempt = [args[i + 1] for i, a in enumerate(args) if a == "--exclude-newer-package"]
if cut and "numpy=false" not in exempt:
    sys.stderr.write("  ╰─▶ Because only numpy<2.0 is available and torch==2.13.0 depends on numpy>=2.0 ...\\n"
                     "      hint: `numpy` was filtered by `exclude-newer` to only include packages uploaded ...\\n")
    sys.exit(1)
print("numpy==2.3.0\\npeft==0.15.2\\ntorch==2.13.0")
"""


class FakeRunner:
    """What resolve_lock needs of the builder, with a scripted uv that logs every call."""

    def __init__(self, tmp_path: Path) -> None:
        script = tmp_path / "uv"
        script.write_text(f"#!{sys.executable}\n{FAKE_UV}")
        script.chmod(0o755)
        self.uv = str(script)
        self.index = IndexConfig()
        self.log = tmp_path / "calls.jsonl"

    def find_python(self, request: str) -> tuple[str, str]:
        return sys.executable, "3.11.7"

    def uv_environ(self) -> dict[str, str]:
        return {**os.environ, "FAKE_UV_LOG": str(self.log)}

    def calls(self) -> list[dict[str, object]]:
        return [json.loads(line) for line in self.log.read_text().splitlines()]


class Dates(ReleaseDates):
    def __init__(self, uploaded: dict[tuple[str, str], dt.datetime]) -> None:
        super().__init__("http://index.invalid/simple")
        self.uploaded = uploaded

    def first_upload(self, package: str, version: str) -> dt.datetime | None:
        return self.uploaded.get((package, version))


PEFT = EnvRequest(packages={"torch": "==2.13.0", "peft": "*"}, python="3.11", exclude_newer=None)


def test_a_lock_is_the_sorted_resolution_resolved_afresh(tmp_path: Path) -> None:
    runner = FakeRunner(tmp_path)
    lock = resolve_lock(runner, PEFT, Dates({}))
    assert lock.lines == ("numpy==2.3.0", "peft==0.15.2", "torch==2.13.0") and lock.as_of is None
    (call,) = runner.calls()
    assert "--refresh" in call["args"] and "--exclude-newer" not in call["args"]  # type: ignore[operator]
    assert call["stdin"] == "peft\ntorch==2.13.0\n"


def test_as_of_a_day_pins_stay_and_a_dependency_a_pin_needs_is_exempted(tmp_path: Path) -> None:
    runner = FakeRunner(tmp_path)
    lock = resolve_lock(runner, dataclasses.replace(PEFT, as_of="2025-04-05"), Dates({}))
    first, second = (c["args"] for c in runner.calls())
    assert isinstance(first, list) and isinstance(second, list)
    assert first[first.index("--exclude-newer") + 1] == "2025-04-05T00:00:00Z"
    assert "torch=false" in first and "numpy=false" not in first  # the pin stays as written
    assert "numpy=false" in second  # uv named it: a pin needs it newer than the day
    assert lock.exempted == ("numpy",) and lock.as_of == "2025-04-05"


def test_a_release_uploaded_after_the_day_from_an_undated_folder_is_capped(tmp_path: Path) -> None:
    """uv cannot cut off find-links files (no upload date): the index's dates catch them."""
    runner = FakeRunner(tmp_path)
    dates = Dates({("peft", "0.15.2"): dt.datetime(2025, 4, 17, tzinfo=dt.UTC)})
    # The fake uv always answers 0.15.2, so capping never settles: the resolution gives up, saying why.
    with pytest.raises(EnvironmentUnavailable) as info:
        resolve_lock(runner, dataclasses.replace(PEFT, as_of="2025-04-05"), dates)
    assert "capped {'peft': '<0.15.2'}" in info.value.reason
    assert "peft<0.15.2" in str(runner.calls()[-1]["stdin"])


def test_a_failed_resolution_is_an_unavailable_environment_with_uvs_reason(tmp_path: Path) -> None:
    runner = FakeRunner(tmp_path)
    request = dataclasses.replace(PEFT, exclude_newer="2020-01-01T00:00:00Z")  # a cell's own cut-off: no retries
    with pytest.raises(EnvironmentUnavailable) as info:
        resolve_lock(runner, request, Dates({}))
    assert "numpy" in info.value.reason and len(runner.calls()) == 1


class Locking:
    """A builder that resolves every floating request to ``self.lines`` and records what it got."""

    def __init__(self, lines: tuple[str, ...]) -> None:
        self.lines = lines
        self.requests: list[EnvRequest] = []
        self.locks = 0

    def lock(self, request: EnvRequest) -> Lock:
        self.locks += 1
        return Lock(self.lines, request.as_of, "2026-11-25T00:00:00+00:00", 0.8)

    def get(self, request: EnvRequest, cell: str | None = None) -> object:
        self.requests.append(request)
        return dataclasses.replace(_env(), lock=request.lock)


def _env():
    from harness.environments import Environment

    return Environment("k", "/p", "3.11.7", {}, "/e", "/x", False, 1.0)


def test_the_provider_resolves_a_floating_cell_and_builds_its_lock(tmp_path: Path) -> None:
    cells = load(tmp_path).cells
    builder = Locking(("peft==0.15.2", "torch==2.13.0"))
    env = UvProvider(builder=builder).get(cells["latest"])  # type: ignore[arg-type]
    assert builder.requests[0].lock == ("peft==0.15.2", "torch==2.13.0")
    assert env.resolution is not None and env.resolution["seconds"] == 0.8
    pinned = dataclasses.replace(cells["latest"], packages={"torch": "==2.13.0", "peft": "==0.15.0"})
    UvProvider(builder=builder).get(pinned)  # type: ignore[arg-type]
    assert builder.locks == 1 and builder.requests[1].lock is None  # exact pins are never resolved


class KeyOnly(UvEnvironments):
    def __init__(self, cache: Path) -> None:
        super().__init__(cache, IndexConfig(), uv="uv-not-called")

    def uv_version(self) -> str:
        return "uv 0.0.0"

    def find_python(self, request: str) -> tuple[str, str]:
        return (f"/usr/bin/python{request}", f"{request}.7")


def test_a_floating_environment_is_keyed_by_its_lock_not_its_specs(tmp_path: Path) -> None:
    builds = KeyOnly(tmp_path)
    tonight = dataclasses.replace(PEFT, lock=("peft==0.15.2", "torch==2.13.0"))
    last_night = dataclasses.replace(PEFT, lock=("peft==0.15.2", "torch==2.13.0"))
    new_release = dataclasses.replace(PEFT, lock=("peft==0.15.3", "torch==2.13.0"))
    same_lock_other_spec = dataclasses.replace(tonight, packages={"torch": "==2.13.0", "peft": ">=0.15"})
    assert builds.key(tonight) == builds.key(last_night) == builds.key(same_lock_other_spec)
    assert builds.key(new_release) != builds.key(tonight)


def test_every_install_of_a_floating_environment_is_held_to_its_lock(tmp_path: Path, monkeypatch) -> None:
    from harness.environments import uv as uv_module
    from harness.environments.inventory import Listing

    calls: list[list[str]] = []

    class Recording(KeyOnly):
        def _uv(self, args: list[str], log: Path, extra_env: dict[str, str] | None = None) -> None:
            calls.append(list(args))
            if args[0] == "venv":
                python = Path(args[-1]) / "bin" / "python"
                python.parent.mkdir(parents=True)
                python.write_text("#!/bin/sh\n")
                python.chmod(0o755)  # an interpreter that runs (the build compiles bytecode with it)

    installed = {"peft": "0.15.2", "torch": "2.13.0+cpu", "deepspeed": "0.19.8"}
    monkeypatch.setattr(uv_module, "list_distributions", lambda python: Listing("3.11.7", dict(installed)))
    request = EnvRequest(
        packages={"torch": "==2.13.0", "deepspeed": "*", "peft": "*"},
        python="3.11",
        exclude_newer=None,
        lock=("deepspeed==0.19.8", "peft==0.15.2", "torch==2.13.0"),
    )
    env = Recording(tmp_path).get(request)
    installs = [c for c in calls if c[:2] == ["pip", "install"]]
    assert len(installs) == 3
    for call in installs:
        assert call[call.index("--constraints") + 1] == str(Path(str(env.path)) / LOCK_FILE)
    assert "deepspeed==0.19.8" in installs[1] and "peft==0.15.2" in installs[2]  # the lock's versions, named
    assert env.lock == request.lock


def _real_builder(tmp_path: Path) -> UvEnvironments:
    return UvEnvironments(tmp_path / "cache", pip_index_config(), uv=find_uv())


@pytest.mark.integration
def test_peft_resolves_to_what_was_released_by_each_day(tmp_path: Path) -> None:
    """Real uv, real PyPI: peft 0.15.1 came out between 2025-03-25 and 2025-04-05 (F9's boundary);
    torch stays at its pin, though 2.13.0 came out long after both days."""
    builder = _real_builder(tmp_path)
    request = EnvRequest(packages={"torch": "==2.13.0", "peft": ">=0.15.0,<0.16"}, python="3.11", exclude_newer=None)
    before = builder.lock(dataclasses.replace(request, as_of="2025-03-25")).versions()
    after = builder.lock(dataclasses.replace(request, as_of="2025-04-05")).versions()
    now = builder.lock(request)
    assert before["peft"] == "0.15.0" and after["peft"] == "0.15.1"
    assert before["torch"].startswith("2.13.0") and after["torch"].startswith("2.13.0")
    assert now.versions()["peft"] == "0.15.2" and now.as_of is None


@pytest.mark.integration
def test_an_unknown_package_cannot_be_resolved(tmp_path: Path) -> None:
    request = EnvRequest(packages={"no-such-package-ft-regress": "*"}, python="3.11", exclude_newer=None)
    with pytest.raises(EnvironmentUnavailable) as info:
        _real_builder(tmp_path).lock(request)
    assert "no-such-package-ft-regress" in info.value.reason


def test_as_of_reaches_every_selected_cell_and_a_future_day_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "m.yaml"
    path.write_text(textwrap.dedent(MATRIX))
    tomorrow = str(dt.date.today() + dt.timedelta(days=1))
    done = subprocess.run(
        [sys.executable, "-m", "harness", "run", "--matrix", str(path), "--lane", "watch", "--as-of", tomorrow],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 2 and "in the future" in done.stderr
