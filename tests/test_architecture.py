"""The architecture holds: layers import downwards only, mypy finds no error (harness/, repros/,
benchmarks/), ruff finds nothing, and the docs build strictly (a broken link or a page left out of
the nav fails)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from tests.support.paths import REPO_ROOT

BIN = Path(sys.executable).parent


def tool(name: str) -> str:
    found = BIN / name
    if found.exists():
        return str(found)
    elsewhere = shutil.which(name)
    if elsewhere is None:
        pytest.fail(f"{name} is not installed: pip install -e '.[test]'")
    return elsewhere


def check(command: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, check=False, timeout=900)


def test_every_layer_imports_only_the_layers_below_it() -> None:
    done = check([tool("lint-imports"), "--no-cache"])
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert "broken" in done.stdout and " 0 broken" in done.stdout


def test_mypy_finds_no_error_in_the_orchestrator_or_the_worker_side() -> None:
    # Both sides of the process boundary are checked: the rank's code (repros/) as the harness.
    configured = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["tool"]["mypy"]["files"]
    assert {"harness", "repros", "benchmarks"} <= set(configured)
    done = check([sys.executable, "-m", "mypy", "--no-incremental"])
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]


def test_no_type_ignore_is_left() -> None:
    found = [
        f"{p.relative_to(REPO_ROOT)}:{n}"
        for root in ("harness", "repros", "benchmarks")
        for p in (REPO_ROOT / root).rglob("*.py")
        for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
        if "type: ignore" in line
    ]
    assert found == []


SOURCES = ("harness", "repros", "benchmarks", "tests", "docs", "conftest.py")


def test_ruff_finds_nothing() -> None:
    done = check([sys.executable, "-m", "ruff", "check", *SOURCES])
    assert done.returncode == 0, done.stdout[-6000:]
    formatted = check([sys.executable, "-m", "ruff", "format", "--check", *SOURCES])
    assert formatted.returncode == 0, formatted.stdout[-6000:]


def test_the_docs_build_strictly(tmp_path: Path) -> None:
    done = check([tool("mkdocs"), "build", "--strict", "--site-dir", str(tmp_path / "site")])
    assert done.returncode == 0, done.stderr[-6000:]
    for page in (
        "reference/cli/index.html",
        "reference/guards/index.html",
        "reference/extensions/index.html",
        "architecture/index.html",
        "CATALOG/index.html",
    ):
        assert (tmp_path / "site" / page).is_file(), page
    cli = (tmp_path / "site" / "reference" / "cli" / "index.html").read_text()
    assert "ft-regress run" in cli and "--save-expectations" in cli
