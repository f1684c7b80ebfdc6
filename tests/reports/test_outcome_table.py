"""Every display shows an outcome as the outcome table says (``harness/reports/outcome_table.py``): the
terminal's tables, the HTML report's colours and legend, JUnit's failures. A new outcome is two
files: its member of ``Outcome`` and its row of the table."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

from harness.reports.outcome_table import TABLE, css, shown, terminal_style
from repros.runtime.outcomes import Outcome
from tests.support.paths import REPO_ROOT


def test_every_outcome_has_one_row() -> None:
    assert sorted(str(row.outcome) for row in TABLE) == sorted(str(o) for o in Outcome)
    for row in TABLE:
        assert row.verdict and row.legend and row.colour.terminal and row.colour.background, row.outcome


def test_the_style_sheet_writes_no_outcome_colour_by_hand() -> None:
    sheet = (REPO_ROOT / "harness" / "reports" / "templates" / "report.css").read_text()
    assert not re.findall(r"\.o-(" + "|".join(Outcome) + r")\b", sheet)
    generated = css()
    assert ".o-NEW_FAILURE { background: #ff9f94; font-weight: 600; }" in generated
    assert ".o-DIVERGES.documented { background: #fff1c2; font-weight: 400; }" in generated


def test_a_documented_divergence_is_shown_as_the_failure_that_explains_it() -> None:
    assert terminal_style("DIVERGES") == "bold red" and terminal_style("DIVERGES", documented=True) == "yellow"
    assert terminal_style("PASS", documented=True) == "green"
    assert shown("UNRESOLVABLE").verdict == "could not run"


#: A throwaway outcome, added to the two files a new outcome touches and nowhere else.
THROWAWAY_MEMBER = '    THROWAWAY = "THROWAWAY"\n'
THROWAWAY_ROW = """    Shown(
        Outcome.THROWAWAY,
        "throws it away",
        Colour("bold blue", "#0a0b0c", "font-style: italic"),
        "a throwaway outcome, to see it shown everywhere",
    ),
"""

SHOW_IT = textwrap.dedent(
    """
    import io, json, sys
    from pathlib import Path
    from junitparser import JUnitXml
    from rich.console import Console
    from harness.records.item import ItemRecord
    from harness.records.run_meta import RunMeta
    from harness.reports.html import render_report
    from harness.reports.junit import write_junit
    from harness.reports.terminal import results_table
    from harness.reports.grid_tables import print_grid

    out = Path(sys.argv[1])
    fields = {
        "schema_version": 1, "run_id": "run-1", "signature": None, "versions": {}, "world_size": 2, "device": "cpu",
        "error": {"type": "RuntimeError", "message": "thrown away", "rank": 0}, "reasons": [], "guards": [],
        "env": None, "repro_cmd": "ft-regress run --cells a", "started_at": "2026-11-20T10:00:00+00:00",
        "finished_at": "2026-11-20T10:00:01+00:00", "wall_s": 1.0,
    }
    record = ItemRecord.model_validate(
        {**fields, "cell": "a", "repro": "F1", "mode": "bug", "outcome": "THROWAWAY", "expected": "REPRODUCED",
         "matched": False}
    )
    combination = ItemRecord.model_validate(
        {**fields, "cell": "a", "repro": "deepspeed-zero3+lora", "mode": "as-written", "outcome": "THROWAWAY",
         "expected": None, "matched": False, "scenario": {"engine": "deepspeed-zero3", "adapter": "lora"}}
    )
    seen = {}
    console = Console(file=io.StringIO(), width=200, force_terminal=True, color_system="truecolor")
    console.print(results_table([record]))
    print_grid(console, [combination])
    seen["ansi"] = console.file.getvalue()
    write_junit(out / "junit.xml", "run-1", [record])
    failure = next(iter(next(iter(JUnitXml.fromfile(str(out / "junit.xml"))))))
    seen["junit"] = [failure.result[0].message, failure.result[0].text]
    page = "".join(render_report([record], RunMeta.model_validate({"run_id": "run-1"})))
    seen["html"] = page
    print(json.dumps(seen))
    """
)


def _with_a_throwaway_outcome(root: Path) -> Path:
    """The harness and the worker side copied, with the throwaway outcome in the enum and the table."""
    for package in ("harness", "repros"):
        shutil.copytree(REPO_ROOT / package, root / package, ignore=shutil.ignore_patterns("__pycache__"))
    outcomes = root / "repros" / "runtime" / "outcomes.py"
    text = outcomes.read_text()
    assert '    DIVERGES = "DIVERGES"\n' in text
    outcomes.write_text(text.replace('    DIVERGES = "DIVERGES"\n', '    DIVERGES = "DIVERGES"\n' + THROWAWAY_MEMBER))
    table = root / "harness" / "reports" / "outcome_table.py"
    text = table.read_text()
    end = "\n)\n\n_BY_OUTCOME"
    assert end in text
    table.write_text(text.replace(end, "\n" + THROWAWAY_ROW.rstrip("\n") + end))
    return root


def test_a_new_outcome_in_the_enum_and_the_table_is_shown_in_the_terminal_html_and_junit(tmp_path: Path) -> None:
    root = _with_a_throwaway_outcome(tmp_path / "copy")
    script = tmp_path / "show_it.py"
    script.write_text(SHOW_IT)
    (tmp_path / "out").mkdir()
    done = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "out")],
        capture_output=True,
        text=True,
        cwd=root,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(root), "HOME": str(tmp_path)},
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    # The terminal: the run's table shows it in its colour (bold where it contradicts its expectation),
    # and so does the grid's table (bold blue: ESC[1;34m, or its truecolor form).
    assert "THROWAWAY" in seen["ansi"] and re.search(r"\x1b\[1;34mTHROWAWAY", seen["ansi"]), seen["ansi"]
    # JUnit: the failure says what it means, from the table.
    message, text = seen["junit"]
    assert message == "observed THROWAWAY, expected REPRODUCED"
    assert text.startswith("THROWAWAY: a throwaway outcome, to see it shown everywhere")
    # HTML: its rule generated into the page's style, and a span of it in the legend.
    page = seen["html"]
    assert ".o-THROWAWAY { background: #0a0b0c; font-style: italic; }" in page
    assert '<span class="o-THROWAWAY" title="a throwaway outcome, to see it shown everywhere">THROWAWAY</span>' in page
    assert 'class="entry o-THROWAWAY mismatch"' in page
