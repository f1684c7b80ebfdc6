"""The one JSON type of the orchestrator: what ``json.load`` gives and ``json.dump`` takes.

``JsonValue`` is the recursive JSON value (a mapping of strings to values, a sequence of values, a
string, a number, a boolean or null), for mypy: a value read from JSON is narrowed
(``isinstance``) before its parts are used, and a value built for JSON may hold any of those
(``list[str]`` and ``dict[str, list[str]]`` are JSON values). ``JsonObject`` is one JSON object,
built and changed in place. At run time both are left open (``Any``): pydantic keeps a field of
this type as it was given (a record's own fields are what it validates), so a record written by
an older harness still reads. ``Any`` is otherwise left to boundaries where data is not JSON yet
(argparse's namespaces, YAML before validation, a library's own objects).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeAlias

if TYPE_CHECKING:
    JsonValue: TypeAlias = Mapping[str, "JsonValue"] | Sequence["JsonValue"] | str | int | float | bool | None
else:
    JsonValue = Any

JsonObject: TypeAlias = dict[str, JsonValue]

__all__ = ["JsonObject", "JsonValue"]
