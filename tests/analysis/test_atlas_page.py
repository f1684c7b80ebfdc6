"""The atlas page and its sources keep nothing out of sight (issue 50, class 5): the page shows what runs wrote with
its control characters made visible, as the run's report does (one Jinja environment for every page), and a
torn last line of a run's results is a note of the atlas saying what it dropped, never dropped in silence."""

from __future__ import annotations

import re
from pathlib import Path

from harness.analysis.atlas.build import assemble
from harness.analysis.atlas.evidence import read_sources
from harness.analysis.atlas.html import render_page
from harness.cli.main import main
from harness.reports.pages import page_environment
from tests.analysis.test_atlas import DISCOVERY, ci_run
from tests.support.report_fixture import _record

HOSTILE = "python -m harness run --cells \x1b[2J\x1b[31mcurrent\u202e --repros F1"


def test_what_a_run_wrote_is_shown_with_its_control_characters_visible(tmp_path: Path) -> None:
    run = ci_run(tmp_path / "ci", [_record("current", "F2", "bug", "NOT_REPRODUCED", repro_cmd=HOSTILE)])
    atlas = assemble(DISCOVERY, read_sources([run], DISCOVERY))
    page = render_page(atlas)
    assert "\x1b" not in page and "\u202e" not in page
    assert "\\x1b[2J\\x1b[31mcurrent\\u202e" in page  # shown as it reads


def test_every_page_is_rendered_by_one_environment() -> None:
    env = page_environment()
    assert {"report.html.j2", "atlas.html.j2"} <= set(env.list_templates())
    assert env.from_string("{{ x }}").render(x="a\x1bb\u202ec") == "a\\x1bb\\u202ec"


def test_a_torn_last_line_is_a_note_saying_what_was_dropped(tmp_path: Path, capsys) -> None:
    run = ci_run(tmp_path / "ci")
    with open(run / "results.jsonl", "a", encoding="utf-8") as fh:
        fh.write('{"cell": "current", "repro": "F12", "mode": "bug", "outcome": "REPRO')  # killed mid-write
    assert main(["atlas", "build", "--out", str(tmp_path / "atlas"), "--from", str(run)]) == 0
    said = capsys.readouterr().out
    note = next(line for line in said.splitlines() if "note:" in line)
    assert re.search(r"line 4 is torn: the record of current/F12/bug, cut short .*1 record left out of the atlas", note)
    page = (tmp_path / "atlas" / "index.html").read_text()
    assert "1 record left out of the atlas" in page
