"""The one JSON type of the orchestrator: what ``json.load`` gives and ``json.dump`` takes.

``JsonValue`` is pydantic's recursive JSON type (``dict[str, JsonValue] | list[JsonValue] | str |
int | float | bool | None``), which both mypy and pydantic read: a record's field typed with it is
validated as JSON when the record is read back. ``JsonObject`` is one JSON object. Code that reads
into a value narrows it (``isinstance``) where it needs a shape; ``Any`` is left to boundaries
where data is not JSON yet (argparse's namespaces, YAML before validation, a library's own dicts).
"""

from __future__ import annotations

from typing import TypeAlias

from pydantic import JsonValue

JsonObject: TypeAlias = dict[str, JsonValue]

__all__ = ["JsonObject", "JsonValue"]
