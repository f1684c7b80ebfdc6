"""Reading a user's YAML safely: a key written twice, values nested deeper than any setting, a
document whose aliases expand to billions of values (a 'billion laughs'), a number of thousands of
digits, are each refused with the line they are on, as a ``UserError``, before anything follows
them. The reader itself is the worker side's (``repros/runtime/kinds/safe_yaml.py``), so that a
script repro's declaration is read within the same limits."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from harness.core.errors import UserError
from repros.runtime.kinds import safe_yaml
from repros.runtime.kinds.safe_yaml import MAX_DEPTH, MAX_EXPANDED_VALUES, MAX_NUMBER_CHARS

__all__ = ["MAX_DEPTH", "MAX_EXPANDED_VALUES", "MAX_NUMBER_CHARS", "load_yaml"]


def load_yaml(path: Path, raw: bytes) -> Any:
    """The document in ``raw`` (the bytes of ``path``); a ``UserError`` naming its line where it
    cannot be read safely."""
    try:
        return safe_yaml.load(raw)
    except safe_yaml.YamlRefused as refused:
        where = f"line {refused.line}" if refused.line is not None else ""
        raise UserError(path, where, refused.problem, refused.fix) from None
