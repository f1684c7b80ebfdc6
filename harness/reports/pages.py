"""Every HTML page the harness writes (a run's report, the compatibility atlas) is rendered by one Jinja
environment, from the templates in ``harness/reports/templates/``: every string autoescaped for HTML, an
undefined name an error, and every text a page shows with its control characters (ESC, BEL, NUL, and the
bidirectional overrides such as U+202E that make a line read otherwise) made visible as escapes
(``harness.core.text.plain``), never raw, whatever a run, a repro or a package wrote. Markup a page makes
itself (its figures, styles and script) goes in as it is. A new page is one more template here, never a
second environment.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from importlib import resources

from jinja2 import Environment, PackageLoader, StrictUndefined
from markupsafe import Markup

from harness.core.text import plain
from harness.reports.terminal import format_bytes, format_step


def ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.1f} ms"


def pairs(mapping: Mapping[str, object]) -> str:
    """``{"torch": "==2.13.0", "deepspeed": ["0.19.2", "0.19.8"]}`` as ``torch ==2.13.0, deepspeed 0.19.2 0.19.8``."""
    shown = (f"{k} {' '.join(map(str, v)) if isinstance(v, list | tuple) else v}" for k, v in mapping.items())
    return ", ".join(shown) or "-"


def static_text(name: str) -> str:
    """A page's own static file (its style, its script), as it is."""
    return resources.files("harness.reports").joinpath("templates", name).read_text(encoding="utf-8")


def _visible(value: object) -> object:
    """A value as a page shows it: text with its control characters made visible (``plain``); markup the
    page made itself as it is."""
    if isinstance(value, str) and not isinstance(value, Markup):
        return plain(value)
    return value


@functools.cache
def page_environment() -> Environment:
    env = Environment(
        loader=PackageLoader("harness.reports", "templates"),
        autoescape=True,
        undefined=StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        finalize=_visible,
    )
    env.filters["bytes"] = format_bytes
    env.filters["step"] = format_step
    env.filters["mib_delta"] = lambda n: "-" if n is None else f"{n / 2**20:+.1f} MiB"
    env.filters["ms_delta"] = lambda s: "-" if s is None else f"{s * 1000:+.1f} ms"
    env.filters["ms"] = ms
    env.filters["pairs"] = pairs
    return env


def render_page(template: str, **context: object) -> str:
    """The page ``template`` renders with ``context``."""
    return page_environment().get_template(template).render(**context)
