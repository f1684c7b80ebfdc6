"""What other tools and readers get of the atlas: ``atlas export --format osv`` (one OSV record per failure, each
valid against OSV's own schema) and the page's ground covered (per failure and package, the releases proven bad,
proven good or not yet known, and which surveyed stacks are affected)."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest

from harness.analysis.atlas.build import assemble
from harness.analysis.atlas.coverage import coverage, stretches
from harness.analysis.atlas.evidence import read_sources
from harness.analysis.atlas.html import SurveyedStack, render_page
from harness.analysis.atlas.osv import check_record, osv_schema, record
from tests.analysis.test_atlas import DISCOVERY, cli
from tests.support.report_fixture import _record, write_run

TRL_2514_RUN = {
    "torch": "2.5.1",
    "deepspeed": "0.15.3",
    "peft": "0.14.0",
    "transformers": "4.46.3",
    "accelerate": "1.0.1",
}


def _trl_2514(tmp_path: Path) -> Path:
    record_ = _record("stack", "F1", "bug", "REPRODUCED")
    record_["versions"] = {"python": "3.11.7", **TRL_2514_RUN}
    return write_run(tmp_path / "run", "RUN", "2026-11-29T00:00:00+00:00", [record_])


def test_every_failure_is_one_osv_record_valid_against_osvs_schema(tmp_path: Path) -> None:
    done = cli("export", "--format", "osv", "--out", str(tmp_path / "osv"), "--atlas", str(tmp_path / "none"))
    assert done.returncode == 0, done.stderr
    files = sorted((tmp_path / "osv").glob("*.json"))
    assert [f.stem for f in files] == sorted(f"FTR-{r}" for r in DISCOVERY.repros)
    validator = jsonschema.Draft202012Validator(osv_schema(), format_checker=jsonschema.FormatChecker())
    for path in files:
        data = json.loads(path.read_text())
        assert not list(validator.iter_errors(data)), path
        assert {"id", "modified", "schema_version", "summary", "affected", "database_specific"} <= set(data)


def test_osvs_own_registry_of_databases_is_the_one_rule_relaxed() -> None:
    atlas = assemble(DISCOVERY, read_sources([], DISCOVERY))
    data = record(atlas.failures[0], atlas)
    strict = jsonschema.Draft202012Validator(osv_schema(registered_prefixes_only=True))
    assert [e.validator for e in strict.iter_errors(data)] == ["pattern"]  # "FTR-" is not a registered prefix
    broken = {**data, "modified": "yesterday"}
    with pytest.raises(jsonschema.ValidationError):
        check_record(broken)


def test_f1s_record_holds_the_releases_runs_proved_and_the_combinations_they_held_under(tmp_path: Path) -> None:
    atlas = assemble(DISCOVERY, read_sources([_trl_2514(tmp_path)], DISCOVERY))
    entry = atlas.failure("F1")
    assert entry is not None
    data = record(entry, atlas, DISCOVERY.repros["F1"].spec.upstream)
    affected = {a["package"]["name"]: a for a in data["affected"]}
    deepspeed = affected["deepspeed"]
    assert "0.15.3" in deepspeed["versions"] and "0.19.2" in deepspeed["versions"]
    assert "0.19.3" in deepspeed["database_specific"]["proven_good"]
    # Never further than runs proved: the trl#2514 run and the surveyed stacks each prove their release alone
    # (0.14.4, 0.14.5, 0.15.3); the catalog's <0.19.3 (observed at 0.19.2) ends where 0.19.3 was proven good.
    # Nothing between 0.15.3 and 0.19.2 is claimed.
    *points, last = deepspeed["ranges"]
    assert last == {"type": "ECOSYSTEM", "events": [{"introduced": "0.19.2"}, {"fixed": "0.19.3"}]}
    assert all(r["events"][0]["introduced"] == r["events"][1]["last_affected"] for r in points)
    assert {"0.14.4", "0.15.3"} <= {r["events"][0]["introduced"] for r in points}
    # 0.14.4 is bad under torch 2.5.1 (LLaMA-Factory v0.9.1's stack) and good under torch 2.4.0 (OpenRLHF v0.4.0's).
    assert "0.14.4" in deepspeed["database_specific"]["proven_good"]
    # torch: each surveyed stack proves its release alone; nothing spans the releases between.
    torch = affected["torch"]["ranges"]
    assert all(r["events"][0]["introduced"] == r["events"][1]["last_affected"] for r in torch)
    assert [{"introduced": "2.5.1"}, {"last_affected": "2.5.1"}] in [r["events"] for r in torch]
    assert "torch==2.5.1" in " ".join(deepspeed["database_specific"]["bad_under"]["0.15.3"])
    assert "2.5.1" in affected["torch"]["versions"]
    combos = data["database_specific"]["combinations"]
    assert any(c["when"].get("torch") == "==2.5.1" and c["outcome"] == "REPRODUCED" for c in combos)
    assert any(r["url"] == "https://github.com/huggingface/trl/issues/2514" for r in data["references"])
    assert any(r["type"] == "FIX" and "DeepSpeed/pull/8148" in r["url"] for r in data["references"])


def test_a_stretch_proven_bad_ends_where_a_boundary_drawn_right_after_it_says() -> None:
    spans = [("1.0", "1.1", "1.2"), ("2.0", "2.0", None)]
    assert stretches(spans) == [("1.0", "1.2", "1.1"), ("2.0", None, "2.0")]
    assert stretches([("1.0", "1.5", "1.6"), ("1.2", "1.8", None)]) == [("1.0", None, "1.8")]  # joined


def test_the_page_shows_the_ground_covered_and_the_surveyed_stacks_affected(tmp_path: Path) -> None:
    atlas = assemble(DISCOVERY, read_sources([_trl_2514(tmp_path)], DISCOVERY))
    f1 = {c.package: c for c in coverage(atlas.failure("F1"))}  # type: ignore[arg-type]
    assert f1["deepspeed"].state("0.15.3") == "bad" and f1["deepspeed"].state("0.19.8") == "good"
    assert f1["deepspeed"].state("0.16.0") is None  # not yet known
    surveyed = [SurveyedStack("trl-2514", "trl#2514", "huggingface/trl issue #2514", {"F1": "affected"})]
    page = render_page(atlas, surveyed)
    assert 'id="covered"' in page and "Ground covered" in page
    assert '<span class="chip bad-chip" title="proven under' in page and ">0.15.3</span>" in page
    assert "affected</span>: trl-2514" in page
