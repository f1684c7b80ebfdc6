"""docs/CATALOG.md is generated from the repros' SPECs and must not drift from them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from harness.analysis.catalog import BEGIN, END, render
from harness.config.repros import discover
from tests.support.paths import REPO_ROOT


def check(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "harness", "catalog", "--check", "--path", str(path)],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        check=False,
    )


def test_the_shipped_catalog_matches_every_repros_spec() -> None:
    done = check(REPO_ROOT / "docs" / "CATALOG.md")
    assert done.returncode == 0, done.stdout + done.stderr
    text = (REPO_ROOT / "docs" / "CATALOG.md").read_text()
    for repro in discover().repros.values():
        assert f"## {repro.id} — {repro.spec.title}" in text
        for signature in repro.spec.signatures:
            assert f"`{signature.id}`" in text


def test_a_stale_catalog_is_reported_and_its_hand_written_part_kept(tmp_path: Path) -> None:
    stale = tmp_path / "CATALOG.md"
    stale.write_text("# mine\n\nkept as written\n\n" + BEGIN + "\n## F1 — an old title\n" + END + "\n\ntail kept\n")
    done = check(stale)
    assert done.returncode == 1 and "is stale" in done.stdout
    rendered = render(stale.read_text(), discover().repros.values())
    assert rendered.startswith("# mine\n\nkept as written") and rendered.endswith("\n\ntail kept\n")
    assert "an old title" not in rendered
