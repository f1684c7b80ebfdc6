"""The bisect search against fake outcome functions."""

from __future__ import annotations

import pytest

from harness.workflows.bisect.search import AMBIGUOUS, ENDPOINT_UNUSABLE, ENDPOINTS_AGREE, FOUND, NON_MONOTONIC, search

POINTS = [f"1.{i}" for i in range(10)]


def history(states: str):
    """A fake outcome function: one letter per point, g(ood) b(ad) s(kip)."""
    table = dict(zip(POINTS, states, strict=True))
    calls: list[str] = []

    def probe(point: str, role: str):
        calls.append(point)
        return {"g": "good", "b": "bad", "s": "skip"}[table[point]]

    return probe, calls


def test_regression_finds_the_first_bad_release() -> None:
    probe, calls = history("ggggggbbbb")
    result = search(POINTS, probe)
    assert (result.status, result.kind, result.boundary) == (FOUND, "regression", "1.6")
    assert calls[:2] == ["1.0", "1.9"]  # both endpoints are verified first
    assert len(calls) <= 2 + 4  # log2(10) probes between them


def test_fix_finds_the_first_good_release() -> None:
    probe, _ = history("bbbggggggg")
    result = search(POINTS, probe)
    assert (result.status, result.kind, result.boundary) == (FOUND, "fix", "1.3")


def test_endpoints_that_do_not_differ_stop_the_search() -> None:
    probe, calls = history("gggbbbbggg")
    result = search(POINTS, probe)
    assert result.status == ENDPOINTS_AGREE and calls == ["1.0", "1.9"]


def test_an_endpoint_that_cannot_be_observed_stops_the_search() -> None:
    probe, _ = history("sggggbbbbb")
    assert search(POINTS, probe).status == ENDPOINT_UNUSABLE


def test_a_single_release_in_between() -> None:
    probe, calls = history("gb" + "g" * 8)
    result = search(POINTS[:2], probe)
    assert result.boundary == "1.1" and calls == ["1.0", "1.1"]
    probe, calls = history("gbb" + "g" * 7)
    result = search(POINTS[:3], probe)
    assert result.boundary == "1.1" and calls == ["1.0", "1.2", "1.1"]


def test_skips_away_from_the_boundary_are_searched_around() -> None:
    probe, _ = history("gsgsgggbbb")
    result = search(POINTS, probe)
    assert result.status == FOUND and result.boundary == "1.7"


def test_skips_next_to_the_boundary_leave_an_ambiguous_range() -> None:
    probe, _ = history("ggggssbbbb")
    result = search(POINTS, probe)
    assert result.status == AMBIGUOUS and result.boundary is None
    assert result.candidates == ["1.4", "1.5", "1.6"]
    assert set(result.skipped) == {"1.4", "1.5"}


def test_non_monotonic_history_is_reported_when_verified() -> None:
    probe, _ = history("gbbggggbbb")
    plain = search(POINTS, probe)
    assert plain.status == FOUND  # bisection alone cannot see it
    probe, _ = history("gbbggggbbb")
    checked = search(POINTS, probe, verify=5)
    assert checked.status == NON_MONOTONIC
    assert {p.point for p in checked.contradictions} & {"1.1", "1.2"}


@pytest.mark.parametrize("boundary", range(1, 10))
def test_every_boundary_position_is_found(boundary: int) -> None:
    probe, _ = history("g" * boundary + "b" * (10 - boundary))
    assert search(POINTS, probe).boundary == POINTS[boundary]


def test_a_point_that_failed_differently_is_searched_around_and_reported() -> None:
    points = ["1.0", "1.1", "1.2", "1.3", "1.4", "1.5"]
    truth = {"1.0": "good", "1.1": "good", "1.2": "other", "1.3": "good", "1.4": "bad", "1.5": "bad"}
    result = search(points, lambda p, role: truth[p])  # type: ignore[arg-type,return-value]
    assert result.status == FOUND and result.boundary == "1.4"
    probed_others = [p.point for p in result.probes if p.state == "other"]
    assert result.others == probed_others and result.skipped == []
