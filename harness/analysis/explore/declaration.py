"""Write expectations back into a script repro's declaration (``run --save-expectations``).

Only the ``expectations`` entry is rewritten (or added): the rest of the file, comments
included, stays as the user wrote it. A YAML declaration gets a block under ``repro:``; a
Python one an ``"expectations": [...]`` entry in its ``REPRO = {...}`` literal. The result is
read back and checked before it replaces the file (atomically); a YAML file whose layout cannot
be edited in place (a flow-style ``repro: {...}``) is written out whole, and the caller is told.
"""

from __future__ import annotations

import ast
import os
import pprint
import re
from collections.abc import Mapping, Sequence
from pathlib import Path

import yaml

from harness.config.expectations import holds
from harness.core.json import JsonValue
from repros.runtime.kinds.script import PY_VARIABLE, YAML_SUFFIXES, repro_assignment
from repros.runtime.spec import Expectation

KEY = "expectations"


def merge(
    existing: Sequence[Expectation], derived: Sequence[Expectation], observed: Sequence[Mapping[str, str]]
) -> list[Expectation]:
    """The derived expectations first (the first that holds is the one used), then every existing
    one of another mode, or that holds for none of the versions just observed."""
    modes = {d.mode for d in derived}
    kept = [e for e in existing if e.mode not in modes or not any(holds(e.when, v) for v in observed)]
    return [*derived, *kept]


def as_written(expectations: Sequence[Expectation]) -> list[dict[str, JsonValue]]:
    """Each expectation as the declaration holds it: its empty fields left out, keys in a readable order."""
    written: list[dict[str, JsonValue]] = []
    for e in expectations:
        fields: dict[str, JsonValue] = {
            "mode": e.mode,
            "outcome": str(e.outcome),
            "when": dict(e.when),
            "established_by": e.established_by,
            "note": e.note,
            "device": e.device,
        }
        written.append({k: v for k, v in fields.items() if v not in (None, "", {})})
    return written


def write_expectations(path: Path, expectations: Sequence[Expectation]) -> str:
    """Write ``expectations`` into the declaration at ``path``; return how (for the user)."""
    written = as_written(expectations)
    if path.suffix in YAML_SUFFIXES:
        text, how = _yaml_text(path.read_text(encoding="utf-8"), written)
    else:
        text, how = _python_text(path.read_bytes(), written).decode("utf-8"), "in place"
    tmp = path.with_name(f".{path.name}.ft-regress-tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)
    return how


# -- YAML ----------------------------------------------------------------------------------------------


def _blank_or_comment(line: str) -> bool:
    return not line.strip() or line.lstrip().startswith("#")


def _yaml_text(text: str, expectations: list[dict[str, JsonValue]]) -> tuple[str, str]:
    data = yaml.safe_load(text)
    wanted = {**data["repro"], KEY: expectations}
    root = yaml.compose(text)
    if not isinstance(root, yaml.MappingNode):
        raise ValueError("the declaration is not a YAML mapping")
    repro_key, repro_node = next((k, v) for k, v in root.value if k.value == "repro")
    if isinstance(repro_node, yaml.MappingNode) and not repro_node.flow_style and repro_node.value:
        lines = text.splitlines(keepends=True)
        if lines and not lines[-1].endswith("\n"):
            lines[-1] += "\n"
        indent = repro_node.value[0][0].start_mark.column
        starts = sorted({k.start_mark.line for k, _ in root.value} | {k.start_mark.line for k, _ in repro_node.value})
        current = next((k for k, _ in repro_node.value if k.value == KEY), None)
        begin = current.start_mark.line if current is not None else None
        anchor = begin if begin is not None else repro_node.value[-1][0].start_mark.line
        end = next((line for line in starts if line > anchor), len(lines))
        while end > anchor + 1 and _blank_or_comment(lines[end - 1]):
            end -= 1
        block = yaml.safe_dump(
            {KEY: expectations}, sort_keys=False, default_flow_style=False, width=10**6, allow_unicode=True
        )
        new = [" " * indent + line for line in block.splitlines(keepends=True)]
        edited = lines[: begin if begin is not None else end] + new + lines[end:]
        candidate = "".join(edited)
        if yaml.safe_load(candidate) == {**data, "repro": wanted}:
            return candidate, "in place"
    data["repro"] = wanted
    return yaml.safe_dump(data, sort_keys=False, default_flow_style=False, width=10**6, allow_unicode=True), (
        "rewritten whole (its layout could not be edited in place; comments are lost)"
    )


# -- Python --------------------------------------------------------------------------------------------


def _offset(line_starts: list[int], lineno: int, col: int) -> int:
    return line_starts[lineno - 1] + col


def _python_text(source: bytes, expectations: list[dict[str, JsonValue]]) -> bytes:
    tree = ast.parse(source)
    value = repro_assignment(tree)
    if not isinstance(value, ast.Dict):
        raise ValueError(f"{PY_VARIABLE} is not a dict literal")
    line_starts = [0]
    for line in source.splitlines(keepends=True):
        line_starts.append(line_starts[-1] + len(line))
    keys = [k for k in value.keys if k is not None]
    indent = keys[0].col_offset if keys else value.col_offset + 4
    # One expectation a line, the list's brackets at the entry's indentation.
    inner = "".join(f"{' ' * (indent + 4)}{pprint.pformat(e, width=10**6, sort_dicts=False)},\n" for e in expectations)
    literal = f"[\n{inner}{' ' * indent}]"
    current = next((i for i, k in enumerate(value.keys) if isinstance(k, ast.Constant) and k.value == KEY), None)
    if current is not None:
        node = value.values[current]
        start = _offset(line_starts, node.lineno, node.col_offset)
        end = _offset(line_starts, node.end_lineno or node.lineno, node.end_col_offset or 0)
        edited = source[:start] + literal.encode() + source[end:]
    else:
        brace = _offset(line_starts, value.end_lineno or value.lineno, (value.end_col_offset or 1) - 1)
        if value.values:
            last = value.values[-1]
            last_end = _offset(line_starts, last.end_lineno or last.lineno, last.end_col_offset or 0)
            code = b"\n".join(re.sub(rb"#.*", b"", line) for line in source[last_end:brace].splitlines())
            if b"," not in code:
                source = source[:last_end] + b"," + source[last_end:]
                brace += 1
        line_start = source.rfind(b"\n", 0, brace) + 1
        if source[line_start:brace].strip():
            # The closing brace ends a line of entries: the new entry goes just before it.
            edited = source[:brace] + f' "{KEY}": {literal}'.encode() + source[brace:]
        else:
            edited = source[:line_start] + f'{" " * indent}"{KEY}": {literal},\n'.encode() + source[line_start:]
    edited_value = repro_assignment(ast.parse(edited))
    if edited_value is None:
        raise ValueError(f"the edited file has no {PY_VARIABLE}")
    check = ast.literal_eval(edited_value)
    original = ast.literal_eval(value)
    if check != {**original, KEY: expectations}:
        raise ValueError("the edited REPRO does not read back as written")
    return edited


def paste_lines(expectations: Sequence[Expectation]) -> list[str]:
    """``Expectation(...)`` lines for a repro that declares its expectations in code."""
    lines = []
    for e in as_written(expectations):
        args = [repr(e["mode"]), repr(e["outcome"]), repr(e.get("when") or {})]
        args += [f"{k}={e[k]!r}" for k in ("established_by", "note", "device") if k in e]
        lines.append(f"Expectation({', '.join(args)}),")
    return lines
