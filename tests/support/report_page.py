"""Reading the HTML report's data block (``<script type="application/json" id="report-data">``)
as its script does: the items' details, the folded cells, the history's unchanged items."""

from __future__ import annotations

import json
import re
from typing import Any

DATA = re.compile(r'<script type="application/json" id="report-data">(.*?)</script>', re.S)


def report_data(page: str) -> dict[str, Any]:
    found = DATA.search(page)
    assert found is not None, "the page has no data block"
    data: dict[str, Any] = json.loads(found.group(1))
    return data


def item_facts(page: str, index: int, data: dict[str, Any] | None = None) -> list[tuple[str, str, int]]:
    """Item ``index``'s details: (label, value, how it is shown)."""
    data = data or report_data(page)
    strings = data["strings"]
    flat = data["items"][index][8]
    return [(strings[flat[i]], strings[flat[i + 1]], flat[i + 2]) for i in range(0, len(flat), 3)]


def item_key(data: dict[str, Any], index: int) -> tuple[str, str, str, str]:
    """Item ``index``'s cell, repro, mode and outcome."""
    strings = data["strings"]
    cell, repro, mode, outcome = data["items"][index][:4]
    return strings[cell], strings[repro], strings[mode], strings[outcome]
