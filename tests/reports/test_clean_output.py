"""Output stays clean and honest (issue 40, class 7): control characters and bidirectional overrides
from a run or a matrix reach neither the HTML page nor the terminal raw; ``--out`` never writes over
a folder of the user's own; a refusal names the file that is there; an option's refusal says what it
takes; a ``--pin`` that leaves nothing to run says why. (Half-written files left by a stopped run
are gone once it is resumed: ``tests/pipeline/test_resume_honest.py``.)"""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from harness.records.run_dir import RunDir
from harness.reports import html
from harness.reports.finished import FinishedRun
from tests.cli.test_bad_options import cli, refused
from tests.support.report_fixture import records, write_run

#: ESC (a terminal's clear-screen), BEL, NUL, a right-to-left override and a bidirectional isolate.
HOSTILE = "\x1b[2J\x1b[31mred\x07bell\x00nul \u202eevil\u2066"
RAW = ("\x1b", "\x07", "\x00", "\u202e", "\u2066")


def test_control_characters_of_a_message_reach_the_page_as_escapes(tmp_path: Path) -> None:
    recs = records("run")
    recs[0] = {**recs[0], "error": {"type": "RuntimeError", "message": HOSTILE, "rank": 0}, "reasons": [HOSTILE]}
    run = write_run(tmp_path / "reports" / "run", "run", "2026-11-20T10:00:00+00:00", recs)
    page = html.write(FinishedRun.load(RunDir(run))).read_text(encoding="utf-8")
    assert not [c for c in RAW if c in page]
    # The strings the page's script puts on the page, as it shows them: escapes, never the characters.
    data = json.loads(page.split('id="report-data">', 1)[1].split("</script>", 1)[0])
    assert "\\x1b[2J\\x1b[31mred\\x07bell\\x00nul \\u202eevil\\u2066" in data["strings"]
    assert not [c for text in data["strings"] for c in RAW if c in text]


def test_a_lane_description_reaches_the_terminal_as_it_reads(tmp_path: Path) -> None:
    matrix = tmp_path / "m.yaml"
    cell = {"provider": "passthrough", "lanes": ["x"]}
    matrix.write_text(yaml.safe_dump({"version": 1, "lanes": {"x": f"[bold]{HOSTILE}"}, "cells": {"a": cell}}))
    done = cli(tmp_path, "list", "--matrix", str(matrix))
    assert done.returncode == 0, done.stderr
    assert not [c for c in RAW if c in done.stdout]
    assert "[bold]\\x1b[2J" in done.stdout and "\\u202eevil" in done.stdout  # markup shown, not applied


def test_out_into_a_folder_of_the_users_own_is_refused_and_left_as_it_was(tmp_path: Path) -> None:
    mine = tmp_path / "site"
    mine.mkdir()
    (mine / "index.html").write_text("my page")
    (mine / "junit.xml").write_text("<my/>")
    done = cli(tmp_path, "run", "--matrix", str(_one_cell(tmp_path)), "--out", str(mine))
    refused(done, str(mine), "is not empty and holds no run (index.html, junit.xml)", "new or empty directory")
    assert (mine / "index.html").read_text() == "my page" and (mine / "junit.xml").read_text() == "<my/>"
    assert sorted(p.name for p in mine.iterdir()) == ["index.html", "junit.xml"]


def test_a_refusal_names_the_file_that_is_there(tmp_path: Path) -> None:
    held = tmp_path / "held"
    held.mkdir()
    (held / "run.json").write_text(json.dumps({"run_id": "x"}))
    done = cli(tmp_path, "run", "--matrix", str(_one_cell(tmp_path)), "--out", str(held))
    said = refused(done, f"{held}: run.json: already holds the results of another run")
    assert "results.jsonl" not in said
    merged = cli(tmp_path, "merge", str(held), str(held))
    assert "run.json: already holds the results of a run" in merged.stderr and "results.jsonl" not in merged.stderr
    empty = tmp_path / "empty"
    empty.mkdir()
    assert "results.jsonl:" not in refused(cli(tmp_path, "report", str(empty)), "holds no run")


def test_repeat_says_what_it_takes(tmp_path: Path) -> None:
    for given in ("-1", "0", "x"):
        done = cli(tmp_path, "run", "--matrix", str(_one_cell(tmp_path)), "--repeat", given)
        assert done.returncode == 2 and f"--repeat takes a whole number (1 or more), not '{given}'" in done.stderr


def _one_cell(tmp_path: Path) -> Path:
    path = tmp_path / "one.yaml"
    cell = {"provider": "passthrough", "lanes": ["x"], "repros": ["F1"]}
    path.write_text(yaml.safe_dump({"version": 1, "lanes": {"x": "one"}, "cells": {"a": cell}}))
    return path


def test_a_pin_that_leaves_nothing_to_run_says_why(tmp_path: Path) -> None:
    done = cli(tmp_path, "run", "--matrix", str(_one_cell(tmp_path)), "--pin", "peft==0.15.0")
    refused(done, "--pin: peft==0.15.0: leaves no cell to run", "a (passthrough)", "provider: uv")
    # Where some cells can take it, the others' items are excluded, saying why.
    both = tmp_path / "both.yaml"
    cells = {
        "a": {"provider": "passthrough", "lanes": ["x"], "repros": ["F1"]},
        "b": {"lanes": ["x"], "repros": ["F1"], "packages": {"torch": "==2.13.0", "peft": "==0.21.2"}},
    }
    both.write_text(yaml.safe_dump({"version": 1, "lanes": {"x": "two"}, "cells": cells}))
    from harness.cli import options
    from harness.planning.items import plan_items

    opts = options.selection({"matrix": both, "modes": "bug", "pin": ["peft==0.15.0"]})
    plan = plan_items(opts)
    assert [i.cell.name for i in plan.items] == ["b+peft-0.15.0"]
    (excluded,) = plan.excluded
    assert excluded.cell == "a" and "--pin peft==0.15.0 cannot change its packages" in excluded.reason
