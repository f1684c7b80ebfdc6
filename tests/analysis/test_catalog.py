"""docs/CATALOG.md, docs/index.md's table and matrix.yaml's header are generated from the failures'
SPECs (and the matrix) and must not drift from them: ``catalog --check`` fails when one has."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest

from harness.analysis.catalog import BEGIN, END, catalog_path, render
from harness.cli.commands import catalog as catalog_command
from harness.cli.commands.catalog import pages, stale
from harness.cli.main import main
from harness.config.repros import Discovery, discover
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


def _with_title(repro_id: str, title: str) -> Discovery:
    found = discover()
    repro = found.repros[repro_id]
    changed = dataclasses.replace(repro, spec=dataclasses.replace(repro.spec, title=title))
    return Discovery({**found.repros, repro_id: changed}, found.broken)


def test_every_generated_page_is_current_and_a_changed_title_makes_those_showing_it_stale() -> None:
    shipped = pages(catalog_path(REPO_ROOT), discover())
    assert [p.path.relative_to(REPO_ROOT).as_posix() for p in shipped] == [
        "docs/CATALOG.md",
        "docs/index.md",
        "matrix.yaml",
    ]
    assert all(not stale(p, p.path.read_text(encoding="utf-8")) for p in shipped)
    renamed = pages(catalog_path(REPO_ROOT), _with_title("F1", "a title nobody regenerated"))
    outdated = [p.path.name for p in renamed if stale(p, p.path.read_text(encoding="utf-8"))]
    assert outdated == ["CATALOG.md", "index.md"]


def test_catalog_check_fails_when_a_title_changed_without_the_pages(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(catalog_command, "discover", lambda: _with_title("F2", "a title nobody regenerated"))
    assert main(["catalog", "--check"]) == 1
    out = capsys.readouterr().out
    assert "+| F2 | a title nobody regenerated |" in out
    assert "docs/CATALOG.md is stale" in out and "docs/index.md is stale" in out and "matrix.yaml is stale" not in out


def test_the_matrix_header_lists_each_failures_cells_and_a_new_cell_makes_it_stale(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "index.md").write_text((REPO_ROOT / "docs" / "index.md").read_text())
    text = (REPO_ROOT / "matrix.yaml").read_text()
    header = text.split(catalog_command.MATRIX_BEGIN, 1)[1].split(catalog_command.MATRIX_END, 1)[0]
    assert "#   F1   REPRODUCED (deepspeed <0.19.3): ds-0.19.2, tf4-ds-0.18.0 |" in header
    # A cell added for F1's window, and nothing regenerated: the header no longer says where F1 runs.
    added = text.replace(
        "\ncells:\n",
        '\ncells:\n  ds-0.19.1:\n    packages: {deepspeed: "==0.19.1"}\n    repros: [F1]\n    lanes: [nightly]\n',
    )
    (tmp_path / "matrix.yaml").write_text(added)
    matrix_page = pages(tmp_path / "CATALOG.md", discover(), root=tmp_path)[2]
    diff = stale(matrix_page, added)
    assert any("ds-0.19.1 (nightly)" in line for line in diff if line.startswith("+"))
