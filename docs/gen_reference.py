"""The generated reference pages (run by mkdocs-gen-files at every ``mkdocs build``), so they
cannot drift from the code: the command line from the parsers themselves, the fixed trainer's
guards from their table, and every extension point with what is registered there now."""

from __future__ import annotations

import argparse
import inspect
import os
from collections.abc import Iterable

import mkdocs_gen_files

from harness.cli.extensions import EXTENSION_POINTS
from harness.cli.main import parser
from repros.trainer.guards import GUARDS

os.environ.setdefault("COLUMNS", "110")


def _subparsers(root: argparse.ArgumentParser) -> Iterable[tuple[str, argparse.ArgumentParser]]:
    for action in root._actions:  # noqa: SLF001 - argparse keeps its subparsers here
        if isinstance(action, argparse._SubParsersAction):  # noqa: SLF001
            yield from action.choices.items()


def cli_page() -> str:
    root = parser()
    root.prog = "ft-regress"
    lines = [
        "# Command-line reference",
        "",
        "Generated from the parsers at every docs build: what `ft-regress VERB --help` prints "
        "(`python -m harness VERB --help` from a checkout).",
        "",
        "```text",
        root.format_help().rstrip(),
        "```",
    ]
    for name, sub in _subparsers(root):
        sub.prog = f"ft-regress {name}"
        lines += ["", f"## {name}", "", "```text", sub.format_help().rstrip(), "```"]
        for action, inner in _subparsers(sub):  # a verb's own actions (``atlas build``, ``atlas check``)
            inner.prog = f"ft-regress {name} {action}"
            lines += ["", f"### {name} {action}", "", "```text", inner.format_help().rstrip(), "```"]
    return "\n".join(lines) + "\n"


class _AnyInstalled(dict[str, object]):
    """Versions where every package is installed at some version, shown as X."""

    def get(self, key: str, default: object = None) -> object:  # noqa: ARG002 - dict's signature
        return "X"


def guards_page() -> str:
    lines = [
        "# The fixed trainer's guards",
        "",
        "Generated from `GUARDS` in `repros/trainer/guards.py` at every docs build: each documented failure's "
        "guard is declared in its catalog module (`GUARD`), the hygiene guards in `guards.py`. The fixed trainer "
        "walks the table in order; each guard applies where its condition holds for the scenario and "
        "the installed versions, changes the scenario fields listed, and is recorded with its reason.",
        "",
        "| guard | works around | sets | why (X: the installed version) |",
        "|---|---|---|---|",
    ]
    for rule in GUARDS.values():
        effect = ", ".join(f"`{k}={v!r}`" for k, v in rule.effect.items())
        why = rule.reason(_AnyInstalled()).replace("|", "\\|")
        lines.append(f"| `{rule.id}` | {rule.works_around or '—'} | {effect} | {why} |")
    for rule in GUARDS.values():
        failures = ", ".join((rule.works_around, *rule.also_works_around)) if rule.works_around else "hygiene"
        lines += [
            "",
            f"## `{rule.id}` ({failures})",
            "",
            rule.explained,
            "",
            f"Declared in `{rule.applies.__module__}`.",
        ]
    return "\n".join(lines) + "\n"


def extensions_page() -> str:
    lines = [
        "# Extension points",
        "",
        "Generated from the registries themselves at every docs build: each kind of extension is one "
        "new file plus one registration, in the harness or from an installed package's entry point "
        "(where the kind has a group), and what is registered now.",
        "",
        "| kind | the interface | add a file in | register it in | or an installed package's entry point in | "
        "registered now |",
        "|---|---|---|---|---|---|",
    ]
    for point in EXTENSION_POINTS:
        names = ", ".join(f"`{n}`" for n in point.registered())
        group = f"`{point.group}`" if point.group else "(code only: the ranks use it)"
        lines.append(
            f"| {point.kind} | `{point.interface}` | `{point.directory}` | `{point.where}` | {group} | {names} |"
        )
    lines += ["", "Each interface:", ""]
    for point in EXTENSION_POINTS:
        doc = inspect.cleandoc(point.describe())
        lines += [f"## {point.kind}", "", doc, ""]
    return "\n".join(lines)


with mkdocs_gen_files.open("reference/cli.md", "w") as fh:
    fh.write(cli_page())
with mkdocs_gen_files.open("reference/guards.md", "w") as fh:
    fh.write(guards_page())
with mkdocs_gen_files.open("reference/extensions.md", "w") as fh:
    fh.write(extensions_page())
