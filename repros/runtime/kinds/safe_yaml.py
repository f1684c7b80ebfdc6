"""Reading a user's YAML within limits: a matrix (``harness/config/matrix.py``) and a script
repro's declaration (``script.py``) are read here, so that what would crash or exhaust the reader
is refused with the line it is on instead.

Refused: a key written twice in one mapping (PyYAML would keep the last); values nested deeper
than anything such a file needs (PyYAML recurses, and a few kilobytes of ``[[[[...`` exhaust
Python's stack); a document whose aliases expand to a huge number of values (a "billion laughs",
which validating or printing would follow); a number written with more characters than any real
setting has (Python refuses to convert an integer of thousands of digits); a scalar that looks
like a number or a date but is not one (``2024-13-45``).

Standard library only, except PyYAML, imported where a file is read (the orchestrator, which has
it): the ranks never read YAML.
"""

from __future__ import annotations

import functools
from typing import Any

#: How deep values may nest: a matrix nests 6 deep (grid.expect[i].combination.axis[j]).
MAX_DEPTH = 32
#: The most values a document may expand to, its YAML aliases followed: a real matrix has a few hundred.
MAX_EXPANDED_VALUES = 100_000
#: The most characters a number may be written with (a timeout, a world size: a few digits).
MAX_NUMBER_CHARS = 64


class YamlRefused(ValueError):
    """YAML that is not read: ``line`` (1-based, None where there is none) says where, ``problem``
    what is wrong and ``fix`` what to do."""

    def __init__(self, line: int | None, problem: str, fix: str) -> None:
        self.line = line
        self.problem = problem
        self.fix = fix
        where = f"line {line}: " if line is not None else ""
        super().__init__(f"{where}{problem}; {fix}")


def load(raw: bytes | str) -> Any:
    """The document in ``raw``, read with PyYAML's safe loader within the limits above; anything
    refused (its syntax included) raises ``YamlRefused``."""
    import yaml

    try:
        _refuse_deep(raw)
        loader = _loader()(raw)
        try:
            root = loader.get_single_node()
            if root is None:
                return None
            _refuse_bombs(root)
            return loader.construct_document(root)
        finally:
            loader.dispose()
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = mark.line + 1 if mark else None
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        if isinstance(exc, yaml.constructor.ConstructorError):
            raise YamlRefused(line, problem, "correct it there") from None
        raise YamlRefused(line, f"is not valid YAML ({problem})", "fix the syntax there") from None


def _refuse_deep(raw: bytes | str) -> None:
    """Follow the parser's events (it keeps a stack of its own; the composer recurses) and stop
    at the first value nested deeper than ``MAX_DEPTH``."""
    import yaml

    depth = 0
    for event in yaml.parse(raw, Loader=yaml.SafeLoader):
        if isinstance(event, (yaml.SequenceStartEvent, yaml.MappingStartEvent)):
            depth += 1
            if depth > MAX_DEPTH:
                raise YamlRefused(
                    event.start_mark.line + 1 if event.start_mark else None,
                    f"nests values more than {MAX_DEPTH} deep",
                    "write the value out flat (no setting nests that deep)",
                )
        elif isinstance(event, (yaml.SequenceEndEvent, yaml.MappingEndEvent)):
            depth -= 1


def _refuse_bombs(root: Any) -> None:
    """Count the values the document expands to, its aliases followed, and refuse a 'billion
    laughs'. Iterative: aliases may chain far deeper than any one value nests."""
    import yaml

    sizes: dict[int, int] = {}
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, children_done = stack.pop()
        if isinstance(node, yaml.SequenceNode):
            children: list[yaml.Node] = list(node.value)
        elif isinstance(node, yaml.MappingNode):
            children = [part for pair in node.value for part in pair]
        else:
            children = []
        if children_done:
            sizes[id(node)] = 1 + sum(sizes[id(child)] for child in children)
            if sizes[id(node)] > MAX_EXPANDED_VALUES:
                raise YamlRefused(
                    root.start_mark.line + 1,
                    f"expands to more than {MAX_EXPANDED_VALUES} values through its YAML aliases",
                    "write the values out, or share fewer of them through aliases",
                )
            continue
        if id(node) in sizes:
            continue
        sizes[id(node)] = 1  # a recursive alias counts once: it cannot be followed forever
        stack.append((node, True))
        stack.extend((child, False) for child in children if id(child) not in sizes)


@functools.cache
def _loader() -> Any:
    """PyYAML's safe loader, refusing a key written twice, a number too long to be a setting, and
    a scalar its tag cannot be made of (``!!bool maybe``, ``2024-13-45``) with the line it is on."""
    import yaml

    class Loader(yaml.SafeLoader):
        def construct_object(self, node: yaml.Node, deep: bool = False) -> Any:
            try:
                return super().construct_object(node, deep=deep)
            except (ValueError, KeyError, OverflowError, TypeError) as exc:
                if isinstance(exc, yaml.YAMLError):
                    raise
                what = f"{node.value!r}" if isinstance(node, yaml.ScalarNode) else "this value"
                kind = node.tag.rsplit(":", 1)[-1]
                raise yaml.constructor.ConstructorError(
                    None, None, f"{what} is not a valid {kind} ({exc})", node.start_mark
                ) from None

        def construct_unique_mapping(self, node: yaml.MappingNode, deep: bool = False) -> Any:
            seen: dict[Any, int] = {}
            for key_node, _ in node.value:
                key = self.construct_object(key_node, deep=deep)
                try:
                    first = seen.get(key)
                except TypeError:  # an unhashable key: construct_mapping says so, with its line
                    break
                if first is not None:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"key {key!r} appears twice (first on line {first + 1})", key_node.start_mark
                    )
                seen[key] = key_node.start_mark.line
            return self.construct_mapping(node, deep=deep)

        def construct_short_number(self, node: yaml.ScalarNode) -> Any:
            text = self.construct_scalar(node)
            if len(text) > MAX_NUMBER_CHARS:
                raise yaml.constructor.ConstructorError(
                    None,
                    None,
                    f"a number written with {len(text)} characters (at most {MAX_NUMBER_CHARS})",
                    node.start_mark,
                )
            return self.construct_yaml_int(node) if node.tag.endswith(":int") else self.construct_yaml_float(node)

    Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, Loader.construct_unique_mapping)
    Loader.add_constructor("tag:yaml.org,2002:int", Loader.construct_short_number)
    Loader.add_constructor("tag:yaml.org,2002:float", Loader.construct_short_number)
    return Loader
