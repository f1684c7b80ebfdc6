"""The ``script`` kind: a training script the user already has, plus a few declared lines.

A YAML file with a top-level ``repro:`` mapping, or a Python file with a module-level literal
``REPRO = {...}`` (the training script itself, or a file beside it), declares:

    repro:
      id: my-ckpt                      # default: the file's name
      script: train.py                 # relative to this file; a .py REPRO defaults to itself
      args: [--steps, "3"]             # its command line (a list, or one string split like a shell)
      world_size: 2                    # default: the cell's
      fails_with:                      # the error it fails with: type as tracebacks print it, and
        type: torch.utils.checkpoint.CheckpointError     # a regular expression searched in the message
        pattern: "Recomputed values for the following tensors"
      fixed: {args: [--steps, "3", --checkpointing, reentrant]}   # optional: a workaround to run too
      expectations: [...]              # optional; `run --save-expectations` writes them

Each rank runs the script as torchrun would (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``...,
``sys.argv``, ``__name__ == "__main__"``, the script's directory first on ``sys.path``, its
directory as the working directory), through ``repros.runtime.script_runner``; the script sets up
``torch.distributed`` itself. Its exception is recorded like any repro's and matched with the
declared signature: REPRODUCED when it raised the declared error, NOT_REPRODUCED when it ran to
its end, DIFFERENT_ERROR otherwise. ``fixed`` mode, where declared, is a PASS when every rank ran
to its end.

Standard library only, except that a YAML declaration is read with PyYAML where it is read (the
orchestrator, which has it); the ranks get the declaration as data (``rank_params``).
"""

from __future__ import annotations

import ast
import builtins
import difflib
import re
import shlex
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from repros.runtime.kinds import safe_yaml
from repros.runtime.kinds.base import LoadedRepro, ReproFileTooLarge, read_repro_file
from repros.runtime.spec import (
    MAX_WORLD_SIZE,
    MODES,
    PACKAGE_NAME,
    REPRO_ID,
    SIGNATURE_ID,
    Expectation,
    ReproSpec,
    Signature,
)

#: The ranks' params key that carries a script repro's declaration.
PARAM = "script_repro"
YAML_SUFFIXES = (".yaml", ".yml")
PY_VARIABLE = "REPRO"
_YAML_DECLARES = re.compile(r"^repro\s*:", re.MULTILINE)

KEYS = (
    "id",
    "title",
    "script",
    "args",
    "world_size",
    "env",
    "cwd",
    "fails_with",
    "fixed",
    "upstream",
    "description",
    "expectations",
)
FIXED_KEYS = ("script", "args", "env", "cwd")
SIGNATURE_KEYS = ("type", "pattern", "id", "description")
EXPECTATION_KEYS = ("mode", "outcome", "when", "established_by", "note", "device")


class DeclarationError(ValueError):
    """A declaration that cannot be used; its text names the file, the field and the fix."""

    def __init__(self, path: Path, field: str, problem: str, fix: str) -> None:
        super().__init__(f"{path}: {field}: {problem}; {fix}")
        self.parts = {"file": str(path), "field": field, "problem": problem, "fix": fix}


def declared_id(path: Path) -> str | None:
    """The id a declaration gives itself, where it can be read at all (its other fields unchecked)."""
    try:
        declared = read_declaration(path).get("id")
    except (DeclarationError, SyntaxError, ValueError, OSError):
        return None
    return declared if isinstance(declared, str) and declared else None


def declares_repro(path: Path) -> bool:
    """Read, never run: a YAML file with a top-level ``repro:`` key, or a ``.py`` file assigning
    ``REPRO`` at module level."""
    if path.suffix not in (".py", *YAML_SUFFIXES):
        return False
    try:
        raw = read_repro_file(path)
    except ReproFileTooLarge:
        return True  # claimed, so that loading it says why it is not read
    except OSError:
        return False
    if path.suffix in YAML_SUFFIXES:
        return bool(_YAML_DECLARES.search(raw.decode("utf-8", errors="replace")))
    if path.suffix != ".py":
        return False
    try:
        tree = ast.parse(raw, filename=str(path))
    except (SyntaxError, ValueError):
        return b"REPRO" in raw  # broken: claimed (if it mentions REPRO at all), so that loading it says why
    return repro_assignment(tree) is not None


def repro_assignment(tree: ast.Module) -> ast.expr | None:
    for node in tree.body:
        value: ast.expr | None
        if isinstance(node, ast.Assign):
            targets, value = node.targets, node.value
        elif isinstance(node, ast.AnnAssign):
            targets, value = [node.target], node.value
        else:
            continue
        if value is not None and any(isinstance(t, ast.Name) and t.id == PY_VARIABLE for t in targets):
            return value
    return None


def read_declaration(path: Path) -> dict[str, Any]:
    """The ``repro:`` mapping of a YAML file, or the literal ``REPRO`` of a Python file."""
    if path.suffix in YAML_SUFFIXES:
        try:
            import yaml  # noqa: F401 - only to say so where it is missing
        except ImportError:  # pragma: no cover - the orchestrator has PyYAML; ranks get data
            raise DeclarationError(path, "repro", "PyYAML is needed to read it here", "install PyYAML") from None
        try:
            data = safe_yaml.load(_read(path))
        except safe_yaml.YamlRefused as refused:
            where = f"line {refused.line}" if refused.line is not None else "repro"
            raise DeclarationError(path, where, refused.problem, refused.fix) from None
        if not isinstance(data, dict) or not isinstance(data.get("repro"), dict):
            raise DeclarationError(path, "repro", "is not a mapping", "write 'repro:' with its fields indented below")
        return dict(data["repro"])
    tree = ast.parse(_read(path), filename=str(path))
    value = repro_assignment(tree)
    if value is None:
        raise DeclarationError(path, PY_VARIABLE, "is not assigned", "write REPRO = {...} at the top level")
    try:
        data = ast.literal_eval(value)
    except ValueError:
        raise DeclarationError(
            path,
            f"{PY_VARIABLE} (line {value.lineno})",
            "is not a literal",
            "write it with strings, numbers, lists and dicts only (it is read, never run)",
        ) from None
    if not isinstance(data, dict):
        raise DeclarationError(path, PY_VARIABLE, f"is a {type(data).__name__}", "make it a dict")
    data.setdefault("script", path.name)
    return data


def _read(path: Path) -> bytes:
    try:
        return read_repro_file(path)
    except ReproFileTooLarge as exc:
        raise DeclarationError(path, "(file)", exc.problem, exc.fix) from None


def _check_keys(path: Path, where: str, data: Mapping[str, Any], allowed: tuple[str, ...]) -> None:
    for key in data:
        if key not in allowed:
            near = difflib.get_close_matches(str(key), allowed, n=1)
            hint = f"did you mean {near[0]!r}? " if near else ""
            raise DeclarationError(path, f"{where}{key}", "is not a known field", f"{hint}known: {', '.join(allowed)}")


def _text_list(path: Path, field: str, value: Any) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return shlex.split(value)
    if isinstance(value, list) and all(isinstance(v, (str, int, float)) for v in value):
        return [str(v) for v in value]
    raise DeclarationError(path, field, "is not a command line", "give a list of arguments, or one string")


def _env(path: Path, field: str, value: Any) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise DeclarationError(path, field, "is not a mapping", "write NAME: value pairs")
    return {str(k): str(v) for k, v in value.items()}


def _command(path: Path, where: str, data: Mapping[str, Any], base: Mapping[str, Any] | None) -> dict[str, Any]:
    """What a rank runs: the script's absolute path, its arguments, its variables, its directory."""
    here = path.resolve().parent
    script_text = data.get("script", (base or {}).get("script_text"))
    if not isinstance(script_text, str) or not script_text:
        raise DeclarationError(path, f"{where}script", "is missing", "name the training script, relative to this file")
    script = (here / script_text).resolve()
    if not script.is_file():
        raise DeclarationError(
            path,
            f"{where}script",
            f"{script_text!r} is not a file ({script})",
            "name the training script, relative to this file",
        )
    cwd_text = data.get("cwd")
    cwd = (here / cwd_text).resolve() if isinstance(cwd_text, str) else script.parent
    if not cwd.is_dir():
        raise DeclarationError(
            path, f"{where}cwd", f"{cwd_text!r} is not a directory", "give a directory relative to this file"
        )
    args = _text_list(path, f"{where}args", data["args"]) if "args" in data else list((base or {}).get("args", []))
    env = {**(base or {}).get("env", {}), **_env(path, f"{where}env", data.get("env"))}
    return {"script_text": script_text, "path": str(script), "args": args, "env": env, "cwd": str(cwd)}


def _signatures(path: Path, repro_id: str, value: Any) -> list[dict[str, str]]:
    entries = value if isinstance(value, list) else [value]
    if not entries or not all(isinstance(e, dict) for e in entries):
        raise DeclarationError(path, "fails_with", "is missing", "give the error's type and a pattern of its message")
    found = []
    for i, entry in enumerate(entries):
        where = "fails_with" if len(entries) == 1 else f"fails_with[{i}]"
        _check_keys(path, f"{where}.", entry, SIGNATURE_KEYS)
        etype, pattern = entry.get("type"), entry.get("pattern", "")
        if not isinstance(etype, str) or not re.fullmatch(r"[A-Za-z_][\w.]*", etype):
            raise DeclarationError(
                path,
                f"{where}.type",
                f"{etype!r} is not an exception type",
                "write it as the traceback prints it, e.g. torch.utils.checkpoint.CheckpointError",
            )
        if "." not in etype and not isinstance(getattr(builtins, etype, None), type):
            raise DeclarationError(
                path,
                f"{where}.type",
                f"{etype!r} is not a built-in exception",
                "write it with its module, as the traceback prints it (e.g. torch.utils.checkpoint.CheckpointError)",
            )
        if not isinstance(pattern, str):
            raise DeclarationError(path, f"{where}.pattern", "is not text", "give a regular expression")
        try:
            re.compile(pattern)
        except re.error as exc:
            raise DeclarationError(
                path,
                f"{where}.pattern",
                f"is not a regular expression ({exc})",
                "escape characters such as ( [ . with a backslash",
            ) from None
        default_id = f"{repro_id}.declared" if len(entries) == 1 else f"{repro_id}.declared-{i + 1}"
        sig_id = entry.get("id") or default_id
        if not isinstance(sig_id, str) or not SIGNATURE_ID.fullmatch(sig_id):
            raise DeclarationError(
                path,
                f"{where}.id",
                f"{sig_id!r} is not a plain name",
                "use up to 128 letters, digits, '.', '_' and '-', starting with a letter or digit",
            )
        description = str(entry.get("description", ""))
        found.append({"id": sig_id, "type": etype, "pattern": pattern, "description": description})
    return found


def _expectations(path: Path, value: Any, modes: tuple[str, ...]) -> list[dict[str, Any]]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(e, dict) for e in value):
        raise DeclarationError(
            path,
            "expectations",
            "is not a list of mappings",
            "write '- {outcome: REPRODUCED, when: {deepspeed: \"<0.19.3\"}}' entries",
        )
    found = []
    for i, entry in enumerate(value):
        _check_keys(path, f"expectations[{i}].", entry, EXPECTATION_KEYS)
        mode = str(entry.get("mode", "bug"))
        if mode not in modes:
            raise DeclarationError(
                path,
                f"expectations[{i}].mode",
                f"{mode!r} is not a mode of this repro",
                f"use one of: {', '.join(modes)}",
            )
        when = entry.get("when") or {}
        if not isinstance(when, dict):
            raise DeclarationError(
                path, f"expectations[{i}].when", "is not a mapping", "write package: specifier pairs"
            )
        for package in when:
            if not isinstance(package, str) or not PACKAGE_NAME.fullmatch(package):
                raise DeclarationError(
                    path,
                    f"expectations[{i}].when",
                    f"{package!r} is not a package name",
                    "write its name on PyPI (letters, digits, '.', '_' and '-') and a specifier, e.g. torch: '<2.5'",
                )
        found.append(
            {
                "mode": mode,
                "outcome": str(entry.get("outcome", "")),
                "when": {str(k): str(v) for k, v in when.items()},
                "established_by": str(entry.get("established_by", "")),
                "note": str(entry.get("note", "")),
                "device": entry.get("device"),
            }
        )
    return found


def normalise(path: Path, data: Mapping[str, Any]) -> dict[str, Any]:
    """The declaration checked and made self-contained (absolute paths): what the ranks are sent."""
    _check_keys(path, "", data, KEYS)
    repro_id = data.get("id", re.sub(r"[^A-Za-z0-9_.-]", "-", path.stem).lstrip("-_.") or "script")
    if not isinstance(repro_id, str) or not REPRO_ID.fullmatch(repro_id):
        raise DeclarationError(
            path, "id", f"{repro_id!r} is not a plain name", "use up to 64 letters, digits, '.', '_' and '-'"
        )
    world_size = data.get("world_size")
    if world_size is not None and (
        not isinstance(world_size, int) or isinstance(world_size, bool) or not 1 <= world_size <= MAX_WORLD_SIZE
    ):
        raise DeclarationError(
            path,
            "world_size",
            f"{world_size!r} is not a number of ranks",
            f"give a whole number from 1 to {MAX_WORLD_SIZE}",
        )
    command = _command(path, "", data, None)
    fixed = data.get("fixed")
    if fixed is not None and not isinstance(fixed, dict):
        raise DeclarationError(
            path, "fixed", "is not a mapping", "give the workaround's args (and script, env) under it"
        )
    if fixed is not None:
        _check_keys(path, "fixed.", fixed, FIXED_KEYS)
    modes = MODES if fixed is not None else ("bug",)
    upstream = data.get("upstream") or []
    signatures = _signatures(path, repro_id, data.get("fails_with"))
    return {
        "id": repro_id,
        "title": str(data.get("title") or f"{Path(command['path']).name} fails with {signatures[0]['type']}"),
        "file": str(path.resolve()),
        "world_size": world_size,
        "command": command,
        "fixed": _command(path, "fixed.", fixed, command) if fixed is not None else None,
        "signatures": signatures,
        "upstream": [str(u) for u in (upstream if isinstance(upstream, list) else [upstream])],
        "description": str(data.get("description", "")),
        "modes": list(modes),
        "expectations": _expectations(path, data.get("expectations"), modes),
    }


def spec_of(declared: Mapping[str, Any]) -> ReproSpec:
    try:
        return ReproSpec(
            id=declared["id"],
            title=declared["title"],
            upstream=tuple(declared["upstream"]),
            signatures=tuple(
                Signature(id=s["id"], exception=s["type"], pattern=s["pattern"], description=s["description"])
                for s in declared["signatures"]
            ),
            expectations=tuple(
                Expectation(e["mode"], e["outcome"], e["when"], e["established_by"], e["note"], e["device"])
                for e in declared["expectations"]
            ),
            modes=tuple(declared["modes"]),
            world_size=declared["world_size"],
            description=declared["description"],
            pass_rule="clean-exit",
        )
    except ValueError as exc:
        raise DeclarationError(
            Path(declared["file"]), "expectations", str(exc), "fix the outcome or mode named"
        ) from None


def _loaded(declared: Mapping[str, Any]) -> LoadedRepro:
    from repros.runtime.script_runner import run_script

    def run(ctx: Any) -> None:
        run_script(declared, ctx)

    return LoadedRepro(spec=spec_of(declared), run=run, owns_process_group=True, rank_params={PARAM: dict(declared)})


class ScriptKind:
    name = "script"
    suffixes: tuple[str, ...] = (".py", *YAML_SUFFIXES)

    def claims(self, path: Path) -> bool:
        return not path.name.startswith("_") and declares_repro(path)

    def load(self, ref: str) -> LoadedRepro:
        path = Path(ref)
        return _loaded(normalise(path, read_declaration(path)))

    def from_rank_params(self, ref: str, params: dict[str, Any]) -> LoadedRepro | None:
        declared = params.get(PARAM)
        return _loaded(declared) if isinstance(declared, dict) else None
