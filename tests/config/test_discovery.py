"""A user's repro files are read in a child process: nothing they do at import reaches the run."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from harness.config.repros import discover
from harness.records.results import read_results
from tests.support import fake_stack

HOSTILE = {
    "exits.py": "import os\nos._exit(0)\nSPEC = None\n",
    "moves.py": "import os\nos.chdir('/')\nraise SystemExit(3)\nSPEC = None\n",
    "prints.py": "print('{\"ok\": true}')\nraise ValueError('nope')\nSPEC = None\n",
}


def test_a_file_that_exits_changes_directory_or_lies_at_import_is_broken_not_fatal(tmp_path: Path) -> None:
    for name, text in HOSTILE.items():
        (tmp_path / name).write_text(text)
    here = Path.cwd()
    found = discover([tmp_path])
    assert Path.cwd() == here  # the orchestrator never ran the files
    assert set(found.broken) == {"exits", "moves", "prints"}
    assert "ended (exit code 0) before it said what it is" in found.broken["exits"].reason
    assert "SystemExit: 3" in found.broken["moves"].reason
    assert "ValueError: nope" in found.broken["prints"].reason


def test_a_helper_module_beside_a_repro_is_importable_and_not_a_repro(tmp_path: Path) -> None:
    fake_stack.write_repro(tmp_path, "H1", "clean", "NOT_REPRODUCED")
    repro = tmp_path / "h1_fake.py"
    repro.write_text("import my_helper\n" + repro.read_text())
    (tmp_path / "my_helper.py").write_text("VALUE = 1\n")
    found = discover([tmp_path])
    assert "H1" in found.repros and found.broken == {}


def test_a_user_signature_with_checks_is_judged_by_the_rank_that_raised(tmp_path: Path) -> None:
    (tmp_path / "checked.py").write_text(
        textwrap.dedent("""
        from repros.runtime.spec import Expectation, ReproSpec, Signature
        def odd_rank(message):
            return "rank 1" in message
        SPEC = ReproSpec(id="C1", title="checked", upstream=(), modes=("bug",),
                         signatures=(Signature(id="C1.odd", exception="ValueError", pattern="boom",
                                               checks=(odd_rank,)),),
                         expectations=(Expectation("bug", "REPRODUCED"),))
        def run(ctx):
            raise ValueError(f"boom on rank {ctx.rank}")
    """)
    )
    spec = discover([tmp_path]).repros["C1"].spec
    (signature,) = spec.signatures
    assert signature.verdict_from_rank  # its check is the repro's code: the orchestrator never runs it
    assert not signature.matches("ValueError", "boom on rank 1")
    assert signature.matches("ValueError", "boom on rank 1", rank_verdicts={"C1.odd": True})
    assert not signature.matches("KeyError", "boom on rank 1", rank_verdicts={"C1.odd": True})


def test_a_run_with_a_file_that_exits_at_import_records_it_and_exits_1(tmp_path: Path) -> None:
    env = fake_stack.run_env(fake_stack.install(tmp_path))
    repros = tmp_path / "repros"
    fake_stack.write_repro(repros, "G1", "clean", "NOT_REPRODUCED")
    (repros / "exits.py").write_text(HOSTILE["exits.py"])
    (repros / "moves.py").write_text(HOSTILE["moves.py"])
    matrix = fake_stack.write_matrix(tmp_path / "matrix.yaml", ["a"])
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "harness",
            "run",
            "--matrix",
            str(matrix),
            "--repros-dir",
            str(repros),
            "--repros",
            "G1,exits,moves",
            "--out",
            "relative-out",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 1, done.stdout + done.stderr
    records = {r.repro: r for r in read_results(tmp_path / "relative-out" / "results.jsonl")}
    assert records["G1"].outcome == "NOT_REPRODUCED"
    assert records["exits"].outcome == records["moves"].outcome == "INFRA"


SPEC_TEMPLATE = textwrap.dedent("""
    from repros.runtime.spec import Expectation, ReproSpec
    SPEC = ReproSpec(id={id!r}, title="t", upstream=(), signatures=(), modes=("bug",), world_size={world_size!r},
                     expectations=(Expectation("bug", {outcome!r}),))
    def run(ctx):
        pass
""")


def test_a_spec_that_could_misreport_or_escape_its_run_directory_is_refused(tmp_path: Path) -> None:
    cases = {
        "escape": dict(id="../../x", world_size=2, outcome="NOT_REPRODUCED"),
        "nobody": dict(id="N1", world_size=-1, outcome="NOT_REPRODUCED"),
        "zero": dict(id="N2", world_size=0, outcome="NOT_REPRODUCED"),
        "wrong_mode": dict(id="N3", world_size=2, outcome="PASS"),  # bug mode cannot observe PASS
    }
    for stem, fields in cases.items():
        (tmp_path / f"{stem}.py").write_text(SPEC_TEMPLATE.format(**fields))
    found = discover([tmp_path])
    assert set(found.broken) == set(cases) and not any(r in found.repros for r in ("../../x", "N1", "N2", "N3"))
    assert "is not allowed" in found.broken["escape"].reason
    assert "world_size -1" in found.broken["nobody"].reason
    assert "cannot observe 'PASS'" in found.broken["wrong_mode"].reason
