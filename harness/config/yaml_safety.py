"""Reading a user's YAML safely: a key written twice is refused (PyYAML would keep the last), and
a document whose aliases expand to billions of values (a 'billion laughs') is refused before
anything follows them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from harness.core.errors import UserError


class UniqueKeyLoader(yaml.SafeLoader):
    """A YAML loader that refuses a key written twice in one mapping (PyYAML keeps the last)."""


def construct_unique_mapping(loader: UniqueKeyLoader, node: yaml.MappingNode, deep: bool = False) -> Any:
    seen: dict[Any, int] = {}
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if key in seen:
            raise yaml.constructor.ConstructorError(
                None, None, f"key {key!r} appears twice (first on line {seen[key] + 1})", key_node.start_mark
            )
        seen[key] = key_node.start_mark.line
    return loader.construct_mapping(node, deep=deep)


UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, construct_unique_mapping)


#: The most values a matrix may expand to, its YAML aliases followed: a real one has a few hundred.
MAX_EXPANDED_VALUES = 100_000


def refuse_alias_bombs(path: Path, raw: bytes) -> None:
    """YAML aliases may share a value (a generated matrix does, for twin cells), but a few
    lines of aliases to aliases expand to billions of values (a 'billion laughs'), which
    validating or printing would follow: count the expanded values first and refuse that."""
    root = yaml.compose(raw, Loader=yaml.SafeLoader)
    if root is None:
        return
    sizes: dict[int, int] = {}

    def expanded(node: yaml.Node) -> int:
        if id(node) in sizes:
            return sizes[id(node)]
        sizes[id(node)] = 1  # a recursive alias counts once: it cannot be followed forever
        if isinstance(node, yaml.SequenceNode):
            total = 1 + sum(expanded(child) for child in node.value)
        elif isinstance(node, yaml.MappingNode):
            total = 1 + sum(expanded(k) + expanded(v) for k, v in node.value)
        else:
            total = 1
        sizes[id(node)] = total
        return total

    total = expanded(root)
    if total > MAX_EXPANDED_VALUES:
        raise UserError(
            path,
            f"line {root.start_mark.line + 1}",
            f"expands to {total} values through its YAML aliases",
            "write the values out, or share less (what every cell shares goes under 'defaults:')",
        )
