"""What a user declares is checked whole: a name is the whole name (a trailing newline is not
dropped), and YAML, numbers and repro files that would crash or exhaust the reader are refused
with one line naming the file and the line or field, never a traceback."""

from __future__ import annotations

import json
import re
import resource
import textwrap
from collections.abc import Iterator
from importlib import resources
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st

from harness.config.expectations import holds
from harness.config.matrix import MatrixValidator, declared_repros_dirs, ecma_anchors, load_matrix
from harness.config.repros import discover
from harness.core.errors import UserError
from repros.runtime.kinds import load_repro
from repros.runtime.kinds.base import MAX_REPRO_FILE_BYTES, ReproFileTooLarge
from repros.runtime.kinds.script import DeclarationError, ScriptKind
from repros.runtime.spec import MODES, Expectation, ReproSpec, Signature

#: Every character ``str.splitlines`` breaks a line at.
BREAKS = ["\n", "\r", "\r\n", "\x0b", "\x0c", "\x1c", "\x1d", "\x1e", "\x85", "\u2028", "\u2029"]
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
PACKAGE = re.compile(r"[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?")
FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def dump(matrix: dict[str, Any]) -> str:
    text = yaml.safe_dump(matrix, sort_keys=False)
    assert yaml.safe_load(text) == matrix
    return text


def dump_any(matrix: dict[str, Any]) -> str:
    """``dump`` in a property: an example YAML cannot hold as it is is not one."""
    text = yaml.safe_dump(matrix, sort_keys=False)
    assume(yaml.safe_load(text) == matrix)
    return text


def load_text(tmp_path: Path, text: str) -> Any:
    path = tmp_path / "m.yaml"
    path.write_text(text)
    return load_matrix(path, known_repros=("F1",), known_modes=MODES)


def refusal(tmp_path: Path, text: str) -> UserError:
    with pytest.raises(UserError) as raised:
        load_text(tmp_path, text)
    assert len(raised.value.line().splitlines()) == 1
    return raised.value


def cell(**settings_: Any) -> dict[str, Any]:
    return {"version": 1, "cells": {"a": {"provider": "passthrough", **settings_}}}


# -- names: the whole name ---------------------------------------------------------------------------


def schema_patterns() -> list[str]:
    text = resources.files("harness.config").joinpath("matrix.schema.json").read_text(encoding="utf-8")

    def walk(node: Any) -> Iterator[str]:
        if isinstance(node, dict):
            if isinstance(node.get("pattern"), str):
                yield node["pattern"]
            for value in node.values():
                yield from walk(value)
        elif isinstance(node, list):
            for value in node:
                yield from walk(value)

    return sorted(set(walk(json.loads(text))))


@pytest.mark.parametrize("pattern", schema_patterns())
@FAST
@given(data=st.data())
def test_every_pattern_of_the_matrix_schema_matches_whole_values_only(pattern: str, data: st.DataObject) -> None:
    whole = pattern.removeprefix("^").removesuffix("$")
    assert pattern == f"^{whole}$", "the matrix's patterns are anchored at both ends"
    good = data.draw(st.from_regex(re.compile(whole), fullmatch=True))
    validator = MatrixValidator({"type": "string", "pattern": pattern})
    assert validator.is_valid(good)
    assert not validator.is_valid(good + data.draw(st.sampled_from(BREAKS)))
    other = data.draw(st.text(max_size=12))
    assert validator.is_valid(other) == bool(re.fullmatch(whole, other))


def test_ecma_anchors_leave_escaped_and_bracketed_dollars_alone() -> None:
    assert ecma_anchors(r"^a$") == r"^a\Z"
    assert ecma_anchors(r"^\$[$]x$") == r"^\$[$]x\Z"
    assert MatrixValidator({"pattern": r"^[$]\$$"}).is_valid("$$")


@FAST
@given(
    name=st.text(alphabet=st.sampled_from([*"aZ09._-/ é", *(b for b in BREAKS if len(b) == 1)]), min_size=1, max_size=8)
)
@example(name="a\n")
def test_a_cell_name_is_accepted_exactly_when_it_is_a_whole_plain_name(tmp_path: Path, name: str) -> None:
    text = dump_any({"version": 1, "cells": {name: {"provider": "passthrough"}}})
    if NAME.fullmatch(name):
        assert list(load_text(tmp_path, text).cells) == [name]
    else:
        assert refusal(tmp_path, text).field == "cells"


@FAST
@given(name=st.from_regex(NAME, fullmatch=True).filter(lambda n: len(n) <= 40), brk=st.sampled_from(BREAKS))
def test_a_lane_name_with_a_line_break_after_it_is_refused(tmp_path: Path, name: str, brk: str) -> None:
    lane = name + brk
    err = refusal(tmp_path, dump_any({"version": 1, "lanes": {lane: "x"}, "cells": {"a": {"provider": "passthrough"}}}))
    assert err.field == "lanes" and "not an allowed name" in err.problem


@FAST
@given(name=st.from_regex(PACKAGE, fullmatch=True).filter(lambda n: len(n) <= 40), brk=st.sampled_from(BREAKS))
def test_a_package_name_with_a_line_break_after_it_is_refused(tmp_path: Path, name: str, brk: str) -> None:
    err = refusal(tmp_path, dump_any({"version": 1, "cells": {"a": {"packages": {name + brk: "==1.0"}}}}))
    assert err.field == "cells.a.packages" and "is not a package name" in err.problem
    err = refusal(
        tmp_path, dump_any({"version": 1, "cells": {"a": {"packages": {"x": "==1"}, "exclude_packages": [name + brk]}}})
    )
    assert err.field == "cells.a.exclude_packages.0" and "is not a package name" in err.problem


@pytest.mark.parametrize("brk", BREAKS)
def test_a_python_version_with_a_line_break_after_it_is_refused(tmp_path: Path, brk: str) -> None:
    err = refusal(tmp_path, dump(cell(python="3.11" + brk)))
    assert err.field == "cells.a.python" and "is not a Python version" in err.problem
    assert load_text(tmp_path, dump(cell(python="3.11.9"))).cells["a"].python == "3.11.9"


def test_a_grid_rule_names_packages_whole_and_as_the_records_do(tmp_path: Path) -> None:
    def grid(versions: dict[str, str]) -> dict[str, Any]:
        rule = {"combination": {}, "outcome": "PASS", "versions": versions}
        return {**cell(), "grid": {"axes": {"dtype": ["bf16", "fp32"]}, "expect": [rule]}}

    err = refusal(tmp_path, dump(grid({"torch\n": "<3"})))
    assert err.field == "grid.expect[0].versions" and "not a package name" in err.problem
    rule = load_text(tmp_path, dump(grid({"Zope_Interface": ">=5"}))).grid.expect[0]
    assert rule.holds({"dtype": "bf16"}, {"zope-interface": "5.1"})


def test_a_repros_expectation_names_a_package_as_its_canonical_name() -> None:
    assert holds({"Zope.Interface": ">=5"}, {"zope-interface": "5.1"})
    assert not holds({"Zope.Interface": ">=6"}, {"zope-interface": "5.1"})


@FAST
@given(name=st.from_regex(re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,40}"), fullmatch=True), brk=st.sampled_from(BREAKS))
def test_a_repro_id_signature_id_or_variant_name_is_a_whole_name(name: str, brk: str) -> None:
    def spec(**fields: Any) -> ReproSpec:
        return ReproSpec(**{"id": name, "title": "t", "upstream": (), "signatures": (), "expectations": (), **fields})

    assert spec().id == name
    for bad in (
        {"id": name + brk},
        {"signatures": (Signature(id=name + brk, exception="ValueError", pattern="x"),)},
        {"expectations": (Expectation("bug", "REPRODUCED", {name.strip("._-") + "x" + brk: "<1"}),)},
    ):
        with pytest.raises(ValueError, match="not"):
            spec(**bad)


# -- YAML that would crash or exhaust the reader -------------------------------------------------------

DEEP = {
    "a flow sequence": "version: 1\ncells: {a: " + "[" * 5000 + "]" * 5000 + "}\n",
    "a flow mapping": "version: 1\ncells: {a: " + "{a: " * 3000 + "1" + "}" * 3000 + "}\n",
    "a block mapping": "version: 1\ncells:\n" + "".join("  " * (i + 1) + f"k{i}:\n" for i in range(400)),
    "a block sequence": "version: 1\ncells:\n  a:\n" + "".join("  " * (i + 2) + "-\n" for i in range(400)),
    "the defaults": "version: 1\ndefaults: " + "[" * 1000 + "]" * 1000 + "\ncells: {a: {}}\n",
    "a key": "version: 1\ncells: {" + "[" * 2000 + "]" * 2000 + ": 1}\n",
}


@pytest.mark.parametrize("text", DEEP.values(), ids=DEEP.keys())
def test_yaml_nested_thousands_deep_is_refused_with_its_line(tmp_path: Path, text: str) -> None:
    err = refusal(tmp_path, text)
    assert err.field.startswith("line ") and "deep" in err.problem
    assert declared_repros_dirs(tmp_path / "m.yaml") == ()  # read first, by the command line: no traceback


def test_values_nested_as_deep_as_a_real_matrix_are_fine(tmp_path: Path) -> None:
    rule = {"combination": {"dtype": ["bf16"]}, "versions": {"torch": "<3"}, "outcome": "PASS"}
    nested = {"grid": {"axes": {"dtype": ["bf16", "fp32"]}, "expect": [rule]}}
    assert load_text(tmp_path, dump({**cell(), **nested})).grid is not None


NUMBER_FIELDS = {
    "version": lambda n: f"version: {n}\ncells: {{a: {{provider: passthrough}}}}\n",
    "defaults.timeout_s": lambda n: (
        f"version: 1\ndefaults: {{timeout_s: {n}}}\ncells: {{a: {{provider: passthrough}}}}\n"
    ),
    "cells.a.world_size": lambda n: f"version: 1\ncells: {{a: {{provider: passthrough, world_size: {n}}}}}\n",
    "a float": lambda n: f"version: 1\ndefaults: {{timeout_s: {n}.5}}\ncells: {{a: {{provider: passthrough}}}}\n",
    "a hex int": lambda n: f"version: 1\ncells: {{a: {{provider: passthrough, world_size: 0x{n}}}}}\n",
    "a sexagesimal int": lambda n: f"version: 1\ncells: {{a: {{world_size: 1{':59' * (len(n) // 3 + 1)}}}}}\n",
}


@pytest.mark.parametrize("field", NUMBER_FIELDS)
@FAST
@given(digits=st.integers(min_value=65, max_value=6000))
def test_a_number_of_thousands_of_digits_is_refused_with_its_line(tmp_path: Path, field: str, digits: int) -> None:
    err = refusal(tmp_path, NUMBER_FIELDS[field]("9" * digits))
    assert err.field.startswith("line ") and "a number written with" in err.problem


@pytest.mark.parametrize(
    ("value", "said"),
    [
        ("!!int abc", "'abc' is not a valid int"),
        ("!!float abc", "'abc' is not a valid float"),
        ("!!bool maybe", "'maybe' is not a valid bool"),
        ("2024-13-45", "'2024-13-45' is not a valid timestamp"),
        ("!!timestamp 2024-02-30", "is not a valid timestamp"),
    ],
)
def test_a_scalar_its_tag_cannot_be_made_of_is_refused_with_its_line(tmp_path: Path, value: str, said: str) -> None:
    err = refusal(tmp_path, f"version: 1\ncells:\n  a:\n    provider: passthrough\n    exclude_newer: {value}\n")
    assert err.field == "line 5" and said in err.problem


@pytest.mark.parametrize(("links", "said"), [(300, "unknown key 'a0'"), (3000, "expands to more than")])
def test_aliases_chained_far_deeper_than_values_nest_are_counted_without_recursion(
    tmp_path: Path, links: int, said: str
) -> None:
    chain = "a0: &a0 [x]\n" + "".join(f"a{i}: &a{i} [*a{i - 1}]\n" for i in range(1, links))
    assert said in refusal(tmp_path, chain + "version: 1\ncells: {a: {provider: passthrough}}\n").problem


# -- a script repro's declaration: the same reader ---------------------------------------------------

DECLARED = "repro:\n  id: mine\n  script: train.py\n  fails_with: {type: ValueError, pattern: boom}\n"
BAD_DECLARATIONS = {
    "deep": (DECLARED + "  args: " + "[" * 3000 + "]" * 3000 + "\n", "line 5", "nests values more than"),
    "long number": (DECLARED + "  world_size: " + "9" * 5000 + "\n", "line 5", "a number written with 5000"),
    "alias bomb": (
        "a: &a [x, x, x, x, x, x, x, x, x, x]\n"
        + "".join(f"{n}: &{n} [{', '.join([f'*{p}'] * 10)}]\n" for p, n in zip("abcdefgh", "bcdefghi", strict=True))
        + DECLARED,
        "line 1",
        "YAML aliases",
    ),
    "key twice": (DECLARED + "  id: again\n", "line 5", "appears twice"),
    "id with a newline": (DECLARED.replace("id: mine", 'id: "mine\\n"'), "id", "is not a plain name"),
    "signature id": (DECLARED.replace("pattern: boom", 'pattern: boom, id: "s\\n"'), "fails_with.id", "plain name"),
    "when": (
        DECLARED + '  expectations: [{outcome: REPRODUCED, when: {"torch\\n": "<3"}}]\n',
        "expectations[0].when",
        "is not a package name",
    ),
    "world size": (DECLARED + "  world_size: 5000\n", "world_size", "is not a number of ranks"),
}


@pytest.mark.parametrize("name", BAD_DECLARATIONS)
def test_a_declaration_that_would_crash_the_reader_or_misname_is_refused_naming_where(
    tmp_path: Path, name: str
) -> None:
    text, where, said = BAD_DECLARATIONS[name]
    (tmp_path / "train.py").write_text("raise ValueError('boom')\n")
    path = tmp_path / "mine.yaml"
    path.write_text(text)
    with pytest.raises(DeclarationError) as raised:
        ScriptKind().load(str(path))
    assert f"{path}: {where}: " in str(raised.value) and said in str(raised.value)


def test_a_declaration_read_in_its_child_is_broken_with_the_reason_not_a_recursion_error(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("raise ValueError('boom')\n")
    (tmp_path / "deep.yaml").write_text(BAD_DECLARATIONS["deep"][0])
    (tmp_path / "spec.yaml").write_text(
        DECLARED.replace("mine", "spec") + "  expectations: [{outcome: REPRODUCED, when: {torch: '>>3'}}]\n"
    )
    found = discover([tmp_path])
    assert "line 5: nests values more than" in found.broken["deep"].reason
    # A specifier no version can be checked against: found when it is read, not after the run.
    assert "'>>3', which is not a version specifier" in found.broken["spec"].reason


# -- a repro file too large to read ----------------------------------------------------------------------


def sparse(path: Path, size: int) -> Path:
    with path.open("wb") as fh:
        fh.truncate(size)
    return path


def test_a_huge_sparse_repro_file_is_broken_for_its_size_and_never_read(tmp_path: Path) -> None:
    size = 1 << 30
    sparse(tmp_path / "huge.py", size)
    sparse(tmp_path / "huger.yaml", size)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    found = discover([tmp_path])
    grown_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    assert grown_kib < 256 * 1024
    for stem in ("huge", "huger"):
        assert f"is {size} bytes, more than a repro file may be ({MAX_REPRO_FILE_BYTES})" in found.broken[stem].reason


def test_a_repro_file_just_over_the_cap_is_refused_and_one_at_it_is_read(tmp_path: Path) -> None:
    over = sparse(tmp_path / "over.py", MAX_REPRO_FILE_BYTES + 1)
    found = discover([tmp_path])
    assert "more than a repro file may be" in found.broken["over"].reason
    with pytest.raises(ReproFileTooLarge):
        load_repro(str(over))  # where a rank loads it: refused the same way
    at = tmp_path / "at.py"
    body = "SPEC = 1\n"
    at.write_text(body + "#" * (MAX_REPRO_FILE_BYTES - len(body) - 1) + "\n")
    assert at.stat().st_size == MAX_REPRO_FILE_BYTES
    found = discover([tmp_path])
    assert "more than a repro file" not in found.broken["at"].reason  # read: its SPEC is no ReproSpec


def test_a_declaration_over_the_cap_is_refused_where_it_is_read(tmp_path: Path) -> None:
    path = tmp_path / "big.yaml"
    path.write_text(textwrap.dedent(DECLARED) + "#" * MAX_REPRO_FILE_BYTES + "\n")
    with pytest.raises(DeclarationError, match="more than a repro file may be"):
        ScriptKind().load(str(path))


def test_jsonschema_itself_still_reads_dollar_as_python_does() -> None:
    """Why the matrix has a validator of its own: the library's ``pattern`` lets a newline through."""
    assert jsonschema.Draft202012Validator({"pattern": "^a$"}).is_valid("a\n")
    assert not MatrixValidator({"pattern": "^a$"}).is_valid("a\n")
