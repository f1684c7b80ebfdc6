"""A user's own matrix and repros, outside the repository: found where a user expects, only what
they asked for planned, a mistyped name answered with the near names, a starter that plans as it is."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from harness.cli import options
from harness.cli.commands.init import STARTER_FILES, write_starter
from harness.config import locate
from harness.core.errors import UserError
from harness.planning.commands import repro_command
from harness.planning.items import plan_items
from tests.support.paths import REPO_ROOT

USER_REPRO = textwrap.dedent("""
    repro:
      id: mine
      script: train.py
      fails_with: {type: ValueError, pattern: boom}
""")


def user_project(root: Path, matrix_extra: dict | None = None) -> Path:
    (root / "repros").mkdir(parents=True)
    (root / "repros" / "train.py").write_text("raise ValueError('boom')\n")
    (root / "repros" / "mine.yaml").write_text(USER_REPRO)
    matrix = {
        "version": 1,
        "defaults": {"packages": {"torch": "==2.13.0"}},
        "cells": {"old": {"packages": {"torch": "==2.12.1"}}, "new": {}},
        **(matrix_extra or {}),
    }
    (root / "matrix.yaml").write_text(yaml.safe_dump(matrix, sort_keys=False))
    return root / "matrix.yaml"


def planned(values: dict, cwd: Path) -> list[str]:
    return [i.id.label() for i in plan_items(options.selection(values, cwd=cwd)).items]


def test_a_matrix_that_names_its_repros_and_their_directory_plans_only_those(tmp_path: Path) -> None:
    user_project(tmp_path, {"repros_dirs": ["repros"], "repros": ["mine"]})
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    assert planned({"matrix": tmp_path / "matrix.yaml"}, elsewhere) == ["old/mine/bug", "new/mine/bug"]
    # Asked for by name, a built-in one runs too (F8 needs torch alone, which these cells install).
    assert "new/F8/bug" in planned({"matrix": tmp_path / "matrix.yaml", "repros": ["F8,mine"]}, elsewhere)


def test_the_repros_of_a_named_directory_are_the_default_not_f1_to_f5(tmp_path: Path) -> None:
    user_project(tmp_path)
    assert planned({"repros_dir": [tmp_path / "repros"]}, tmp_path) == ["old/mine/bug", "new/mine/bug"]


@pytest.mark.parametrize(
    ("where", "values", "said"),
    [
        ("matrix", {}, "repros[0]: unknown repro 'mnie'; did you mean mine?"),
        ("--repros", {"repros": ["F99"]}, "--repros: F99: unknown repro; did you mean F9 or F29 or F19?"),
    ],
)
def test_an_unknown_repro_suggests_the_near_names_and_where_a_users_repros_come_from(
    tmp_path: Path, where: str, values: dict, said: str
) -> None:
    user_project(tmp_path, {"repros_dirs": ["repros"], "repros": ["mnie" if where == "matrix" else "mine"]})
    with pytest.raises(UserError) as raised:
        planned({"matrix": tmp_path / "matrix.yaml", **values}, tmp_path)
    assert said in raised.value.line() and "--repros-dir DIR" in raised.value.line()


def test_a_matrix_repros_dir_that_is_not_there_names_the_field(tmp_path: Path) -> None:
    user_project(tmp_path, {"repros_dirs": ["missing"]})
    with pytest.raises(UserError) as raised:
        planned({"matrix": tmp_path / "matrix.yaml"}, tmp_path)
    assert "matrix.yaml: repros_dirs[0]: 'missing' is not a directory" in raised.value.line()


def test_the_matrix_is_found_here_then_in_the_variable_else_a_message_saying_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    matrix = user_project(tmp_path)
    monkeypatch.delenv(locate.MATRIX_VARIABLE, raising=False)
    assert locate.find_matrix(None, tmp_path) == matrix
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(locate.NoMatrix) as raised:
        locate.find_matrix(None, empty)
    assert "no ./matrix.yaml here, and $FT_REGRESS_MATRIX is not set" in raised.value.line()
    assert "init' for a starter" in raised.value.line()
    monkeypatch.setenv(locate.MATRIX_VARIABLE, str(matrix))
    assert locate.find_matrix(None, empty) == matrix
    monkeypatch.setenv(locate.MATRIX_VARIABLE, str(empty / "gone.yaml"))
    with pytest.raises(UserError, match=r"\$FT_REGRESS_MATRIX: .*gone.yaml: is not a matrix file"):
        locate.find_matrix(None, empty)


def test_list_without_a_matrix_lists_the_repros_and_says_what_is_missing(tmp_path: Path) -> None:
    env = {k: v for k, v in __import__("os").environ.items() if k != locate.MATRIX_VARIABLE}
    done = subprocess.run(
        [sys.executable, "-m", "harness", "list"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("F1 ") and "no matrix: no matrix given" in done.stdout


def test_init_writes_a_starter_that_plans_its_script_in_two_cells_explored(tmp_path: Path) -> None:
    written = write_starter(tmp_path / "mine")
    assert [p.name for p in written] == list(STARTER_FILES)
    items = plan_items(options.selection({}, cwd=tmp_path / "mine")).items
    assert [(i.id.label(), i.explore) for i in items] == [
        ("current/my-training/bug", True),
        ("current/my-training/fixed", True),
        ("ds-0.19.2/my-training/bug", True),
        ("ds-0.19.2/my-training/fixed", True),
    ]
    with pytest.raises(UserError, match="matrix.yaml: already exists; pass --force"):
        write_starter(tmp_path / "mine")
    again = subprocess.run(
        [sys.executable, "-m", "harness", "init", str(tmp_path / "mine")],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert again.returncode == 2 and "already exists" in again.stderr


def test_a_rerun_command_starts_with_the_program_the_user_ran(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    user_project(tmp_path, {"repros_dirs": ["repros"]})
    opts = options.selection({"matrix": tmp_path / "matrix.yaml"}, cwd=tmp_path)
    item = plan_items(opts).items[0]
    monkeypatch.setattr(sys, "argv", ["/home/me/.local/bin/ft-regress", "run"])
    assert repro_command(opts, item).startswith(f"ft-regress run --matrix {tmp_path / 'matrix.yaml'} --cells old ")
    assert repro_command(opts, item).endswith(f"--repros-dir {tmp_path / 'repros'}")
    monkeypatch.setattr(sys, "argv", ["/x/harness/__main__.py"])
    assert repro_command(opts, item).startswith("python -m harness run")
