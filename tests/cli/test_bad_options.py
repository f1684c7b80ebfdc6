"""Bad options and input on the command line: one line naming the option (or file) and the field,
exit status 2, no traceback, and nothing run. A name is the whole name (``--repros $'F1\\n'`` is
not F1), and a path that could not be one, or a directory that is a file, is refused up front."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness.cli import options
from harness.core import paths
from harness.core.errors import EXIT_USAGE, UserError
from harness.planning.items import plan_items

BREAKS = ["\n", "\r", "\r\n", "\x0b", "\x0c", "\x85", "\u2028"]
LONG = "x" * 300


def matrix(tmp_path: Path, repros: list[str] | None = None) -> Path:
    """A matrix of one passthrough cell in lane ``x``, running nothing unless ``repros`` says so."""
    path = tmp_path / "m.yaml"
    cell = {"provider": "passthrough", "lanes": ["x"], "repros": repros or []}
    path.write_text(yaml.safe_dump({"version": 1, "lanes": {"x": "one"}, "cells": {"a": cell}}))
    return path


def cli(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("FT_REGRESS_")}
    base["FT_REGRESS_CACHE"] = str(tmp_path / "cache")
    return subprocess.run(
        [sys.executable, "-m", "harness", *args],
        cwd=tmp_path,
        env={**base, **(env or {})},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def refused(done: subprocess.CompletedProcess[str], *said: str) -> str:
    """The one line of a usage error, with ``said`` in it."""
    assert done.returncode == EXIT_USAGE, done.stdout + done.stderr
    assert "Traceback" not in done.stderr and done.stdout == ""
    assert done.stderr.startswith("error: ") and done.stderr.count("\n") == 1, done.stderr
    for part in said:
        assert part in done.stderr, done.stderr
    return done.stderr


# -- names -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("option", "value", "said"),
    [
        ("--repros", "F1\n", "--repros: F1\\n: unknown repro; did you mean F1"),
        ("--cells", "a\n", "cells: no cell named 'a\\n'; did you mean a?"),
        ("--modes", "bug\n", "--modes: bug\\n: unknown mode"),
        ("--lane", "x\n", "no lane named 'x\\n'"),
        ("--pin", "torch==2.5.1\n", "--pin: torch==2.5.1\\n: is not a requirement"),
    ],
)
def test_a_name_with_a_trailing_newline_is_refused_in_one_line(
    tmp_path: Path, option: str, value: str, said: str
) -> None:
    path = matrix(tmp_path, repros=["F1"])
    done = cli(tmp_path, "run", "--matrix", str(path), "--cells", "a", "--out", str(tmp_path / "o"), option, value)
    refused(done, said)
    assert not (tmp_path / "o").exists()  # nothing ran


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    option=st.sampled_from(["repros", "cells", "modes", "lane"]),
    brk=st.sampled_from([*BREAKS, "\t"]),
    before=st.booleans(),
)
def test_no_name_is_taken_for_the_name_without_its_line_break(
    tmp_path: Path, option: str, brk: str, before: bool
) -> None:
    whole = {"repros": "F1", "cells": "a", "modes": "bug", "lane": "x"}[option]
    values = {"matrix": matrix(tmp_path, repros=["F1"]), "repros": ["F1"], "cells": ["a"]}
    values[option] = (
        (brk + whole if before else whole + brk) if option == "lane" else [brk + whole if before else whole + brk]
    )
    with pytest.raises(UserError) as raised:
        plan_items(options.selection(values, cwd=tmp_path))
    assert len(raised.value.line().splitlines()) == 1


def test_spaces_around_comma_separated_names_are_still_trimmed(tmp_path: Path) -> None:
    assert options.csv(["F1, F5 ,F2"]) == ("F1", "F5", "F2")
    assert options.csv(["F1,\n"]) == ("F1", "\n")


def test_a_lane_given_with_cells_is_checked_not_taken_to_hold_no_cell(tmp_path: Path) -> None:
    values = {"matrix": matrix(tmp_path, repros=["F1"]), "repros": ["F1"], "cells": ["a"], "lane": "y"}
    with pytest.raises(UserError, match="no lane named 'y'"):
        plan_items(options.selection(values, cwd=tmp_path))


@given(text=st.text())
def test_a_user_error_is_one_line_whatever_it_quotes(text: str) -> None:
    assert len(UserError(text, text, text, text).line().splitlines()) == 1


# -- paths ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "args",
    [
        ["run", "--matrix", "{m}", "--out", f"/tmp/{LONG}"],
        ["run", "--matrix", "{m}", "--reports-dir", f"/tmp/{LONG}"],
        ["run", "--matrix", "{m}", "--cache-dir", f"/tmp/{LONG}"],
        ["run", "--matrix", "{m}", "--repros-dir", f"/tmp/{LONG}"],
        ["run", "--matrix", f"/tmp/{LONG}/m.yaml"],
        ["run", "--resume", f"/tmp/{LONG}"],
        ["run", "--matrix", "{m}", "--out", "/tmp/" + "/".join(["y" * 200] * 21)],
        ["report", f"/tmp/{LONG}"],
        ["compare", f"/tmp/{LONG}", "/tmp"],
        ["list", "--matrix", "{m}", "--repros-dir", f"/tmp/{LONG}"],
        ["run", "--matrix", "{m}", "--out", ""],
    ],
    ids=lambda args: " ".join(a[:20] for a in args),
)
def test_a_path_that_could_not_be_one_is_refused_in_one_line(tmp_path: Path, args: list[str]) -> None:
    path = matrix(tmp_path)
    done = cli(tmp_path, *[a.format(m=path) for a in args])
    refused(done, "error: ")
    assert any(word in done.stderr for word in ("more than a file name may have", "more than a path may be", "empty"))


def test_an_output_directory_too_deep_for_what_a_run_writes_under_it_is_refused(tmp_path: Path) -> None:
    deep = Path("/tmp", *["z" * 200] * 17)  # a path, but no room below it for a run's files
    assert len(str(deep)) < paths.PATH_MAX
    with pytest.raises(UserError, match="more than a path may be with room"):
        paths.check_output_dir("--out", deep)


@pytest.mark.parametrize("option", ["--cache-dir", "--reports-dir", "--out"])
def test_a_directory_option_that_names_a_file_is_refused_before_anything_runs(tmp_path: Path, option: str) -> None:
    a_file = tmp_path / "a-file"
    a_file.write_text("not a directory")
    done = cli(tmp_path, "run", "--matrix", str(matrix(tmp_path, repros=["F1"])), option, str(a_file))
    refused(done, f"{a_file}: {option}: cannot be written (it is not a directory)")
    done = cli(tmp_path, "run", "--matrix", str(matrix(tmp_path, repros=["F1"])), option, str(a_file / "below"))
    refused(done, f"{a_file / 'below'}: {option}: cannot be written ({a_file} is not a directory)")


def test_a_cache_variable_that_names_a_file_is_refused_naming_the_variable(tmp_path: Path) -> None:
    a_file = tmp_path / "a-file"
    a_file.write_text("not a directory")
    done = cli(tmp_path, "run", "--matrix", str(matrix(tmp_path)), env={"FT_REGRESS_CACHE": str(a_file)})
    refused(done, "$FT_REGRESS_CACHE: cannot be written (it is not a directory)")


@pytest.mark.parametrize("entry", ["missing", "a-file"])
def test_a_repros_variable_that_is_not_a_directory_is_refused(tmp_path: Path, entry: str) -> None:
    (tmp_path / "a-file").write_text("not a directory")
    done = cli(tmp_path, "list", "--matrix", str(matrix(tmp_path)), env={"FT_REGRESS_REPROS": str(tmp_path / entry)})
    refused(done, f"$FT_REGRESS_REPROS: {tmp_path / entry}: is not a directory")


# -- a matrix that would crash its reader -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("version: 1\ncells: {a: " + "[" * 5000 + "]" * 5000 + "}\n", "line 2: nests values more than 32 deep"),
        ("version: 1\ndefaults: {timeout_s: " + "9" * 5000 + "}\ncells: {a: {}}\n", "line 2: a number written with"),
        (
            "version: 1\ncells: {a: {provider: passthrough, timeout_s: " + "9" * 400 + "}}\n",
            "line 2: a number written with 400",
        ),
        ('version: 1\ncells: {"a\\n": {provider: passthrough}}\n', "cells: 'a\\n' is not an allowed name"),
        (
            'version: 1\ncells: {a: {provider: passthrough, python: "3.11\\n"}}\n',
            "cells.a.python: '3.11\\n' is not a Python version",
        ),
    ],
    ids=["deep", "5000 digits", "400 digits", "cell name", "python"],
)
def test_a_matrix_that_would_crash_its_reader_or_misname_is_one_line(tmp_path: Path, text: str, said: str) -> None:
    path = tmp_path / "m.yaml"
    path.write_text(text)
    refused(cli(tmp_path, "run", "--matrix", str(path), "--out", str(tmp_path / "o")), f"{path}: {said}")
    assert not (tmp_path / "o").exists()


def test_an_argument_error_is_one_line_naming_the_argument_and_where_help_is(tmp_path: Path) -> None:
    done = cli(tmp_path, "run", "--jobs", "many")
    refused(done, "argument --jobs:", "'many'", "--help")


def test_a_matrix_variable_too_long_to_look_up_is_refused_naming_the_variable(tmp_path: Path) -> None:
    done = cli(tmp_path, "run", env={"FT_REGRESS_MATRIX": f"/tmp/{LONG}"})
    refused(done, "$FT_REGRESS_MATRIX: /tmp/xxx", "is not a matrix file")


def test_a_matrix_that_never_ends_is_refused(tmp_path: Path) -> None:
    def limited() -> None:  # the test's own limit: without the cap, reading /dev/zero fills memory
        resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))

    done = subprocess.run(
        [sys.executable, "-m", "harness", "run", "--matrix", "/dev/zero"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        preexec_fn=limited,  # noqa: PLW1509 - sets a limit only, in the child
    )
    refused(done, "/dev/zero: is a character device, not a file (it may never end)")
