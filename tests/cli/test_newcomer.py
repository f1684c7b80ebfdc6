"""What a new user meets first, as they meet it: ``--version``, ``--help`` and each verb's help in plain
words, ``init``'s starter with a mistake of their own reported against the file they made it in, a
misspelled package refused before anything is built."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from harness import __version__
from harness.cli.commands import COMMANDS
from harness.cli.main import main


def said(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    try:
        code = main(list(argv))
    except SystemExit as exit_:  # argparse's --help and --version
        code = int(exit_.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


def test_version_answers(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = said(capsys, "--version")
    assert code == 0 and out.strip().endswith(__version__)


@pytest.mark.parametrize("verb", [None, *(name for name in COMMANDS if name != "bench")])
def test_help_shows_no_raw_markup(capsys: pytest.CaptureFixture[str], verb: str | None) -> None:
    code, out, _ = said(capsys, *([verb] if verb else []), "--help")
    assert code == 0 and out
    assert "``" not in out and "harness/" not in out, out


def test_check_help_speaks_of_the_stack_it_checks_not_of_a_matrix(capsys: pytest.CaptureFixture[str]) -> None:
    _, out, _ = said(capsys, "check", "--help")
    assert not re.search(r"\bmatrix\b|\bcells?\b", out), out


def test_the_cache_directory_help_names_the_variable_that_sets_it(capsys: pytest.CaptureFixture[str]) -> None:
    _, out, _ = said(capsys, "run", "--help")
    assert "$FT_REGRESS_CACHE" in " ".join(out.split())


def test_a_mistyped_error_type_in_the_starter_is_reported_against_repro_yaml_in_the_loaders_words(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    assert said(capsys, "init")[0] == 0
    repro = tmp_path / "repro.yaml"
    repro.write_text(repro.read_text().replace("type: torch.utils.checkpoint.CheckpointError", "type: ValueEror"))
    for verb in ("list", "run"):
        code, _, err = said(capsys, verb)
        assert code == 2
        assert err.startswith(f"error: {repro}: fails_with.type: 'ValueEror' is not a built-in exception; "), err
        assert "write it with its module" in err and "unknown repro" not in err


def test_a_misspelled_package_is_refused_before_anything_is_built(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    said(capsys, "init")
    matrix = tmp_path / "matrix.yaml"
    matrix.write_text(matrix.read_text().replace('deepspeed: "==0.19.2"', 'deepsped: "==0.19.2"'))
    code, _, err = said(capsys, "list")
    assert code == 2
    assert "cells.ds-0.19.2.packages.deepsped: 'deepsped' is not a package the harness tracks" in err
    assert "did you mean deepspeed?" in err
