"""``atlas survey``'s bookkeeping: a survey stopped goes on from what its runs recorded, a disagreement already
looked into is not looked into again, and one a drawn boundary explains is left alone."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console

from harness.analysis.atlas.model import Boundary, Evidence
from harness.analysis.atlas.survey import load_survey
from harness.analysis.atlas.survey_plan import Disagreement
from harness.planning.run_options import RunOptions
from harness.workflows.survey import (
    BISECTS_DIR,
    NOTE_FILE,
    Survey,
    SurveyOptions,
    _already_drawn,
    folded,
)
from tests.analysis.test_atlas import DISCOVERY
from tests.analysis.test_atlas_survey import _point_run

STACKS = {s.id: s for s in load_survey()}
OLD, NEW = STACKS["open-instruct-v0.1.0"], STACKS["open-instruct-v0.3.0"]


def test_a_survey_goes_on_from_every_run_its_directory_holds(tmp_path: Path) -> None:
    out = tmp_path / "survey"
    first = _point_run(
        out / "runs" / "1", {"torch": "2.9.0", "deepspeed": "0.18.4", "transformers": "4.57.6"}, "REPRODUCED"
    )
    atlas = folded(out, DISCOVERY)
    assert str(first) in atlas.sources and (out / "atlas.json").is_file() and (out / "index.html").is_file()
    # A run recorded after (the survey stopped before it was folded in) counts on the next start; nothing twice.
    second = _point_run(
        out / "runs" / "2", {"torch": "2.10.0", "deepspeed": "0.18.4", "transformers": "5.4.0"}, "NOT_REPRODUCED"
    )
    again = folded(out, DISCOVERY)
    assert str(second) in again.sources
    f5 = again.failure("F5")
    assert f5 is not None
    runs = [c for c in f5.claims if c.source == "run"]
    assert sorted(c.outcome for c in runs) == ["NOT_REPRODUCED", "REPRODUCED"]
    assert len([c for c in folded(out, DISCOVERY).failure("F5").claims if c.source == "run"]) == 2  # type: ignore[union-attr]


def _disagreement() -> Disagreement:
    return Disagreement("F5", OLD, NEW, {"torch": ("2.9.0", "2.10.0"), "transformers": ("4.57.6", "5.4.0")})


def test_a_disagreement_looked_into_is_not_looked_into_again(tmp_path: Path) -> None:
    out = tmp_path / "survey"
    note = out / BISECTS_DIR / "F5-open-instruct-v0.1.0-open-instruct-v0.3.0" / NOTE_FILE
    note.parent.mkdir(parents=True)
    note.write_text("{}")
    opts = SurveyOptions(out, [OLD, NEW], [OLD, NEW], ["F5"], "cpu", 4, [])

    def no_run(matrix: Path, repros: object, out_dir: Path | None) -> RunOptions:
        raise AssertionError("nothing runs for a disagreement looked into already")

    survey = Survey(opts, DISCOVERY, no_run, Console(), folded(out, DISCOVERY))
    survey.bisect(_disagreement())
    assert not (out / "runs").exists()


def test_a_boundary_drawn_between_the_two_under_the_affected_stack_explains_it(tmp_path: Path) -> None:
    atlas = folded(tmp_path / "survey", DISCOVERY, write=False)
    proof = Evidence(command="ft-regress bisect ...", outcome="first good: transformers==5.0.0", source="bisect")
    drawn = Boundary(
        package="transformers",
        kind="fixed",
        last_bad="4.57.6",
        first_good="5.0.0",
        under={"torch": "==2.9.0", "deepspeed": "==0.18.4", "device": "cpu"},
        status="proven",
        source="bisect",
        evidence=[proof],
    )
    f5 = atlas.failure("F5")
    assert f5 is not None
    with_boundary = atlas.model_copy(
        update={"failures": [f.model_copy(update={"boundaries": [*f.boundaries, drawn]}) if f.id == "F5" else f
                             for f in atlas.failures]}
    )  # fmt: skip
    assert _already_drawn(with_boundary, _disagreement(), "transformers")
    assert not _already_drawn(with_boundary, _disagreement(), "torch")  # no boundary along torch
    elsewhere = drawn.model_copy(update={"under": {"torch": "==2.13.0", "deepspeed": "==0.18.4"}})
    other = atlas.model_copy(
        update={"failures": [f.model_copy(update={"boundaries": [elsewhere]}) if f.id == "F5" else f
                             for f in atlas.failures]}
    )  # fmt: skip
    assert not _already_drawn(other, _disagreement(), "transformers")  # proven under another torch
    assert not _already_drawn(atlas, _disagreement(), "transformers")  # the catalog's own boundary is no bisect
