"""DeepSpeed's /dev/shm segments are removed after the item that made them, and only those."""

from __future__ import annotations

from pathlib import Path

from harness.execution.containment.shm import remove_item_segments
from tests.support.rank_records import rank_record


def segment(shm: Path, name: str) -> Path:
    path = shm / name
    path.write_bytes(b"\0" * 16)
    return path


def test_only_the_items_own_segments_are_removed(tmp_path: Path) -> None:
    mine = [segment(tmp_path, f"deepspeed_allreduce_buffer_0_localhost_33019_{r}") for r in (0, 1)]
    other_item = segment(tmp_path, "deepspeed_allreduce_buffer_0_localhost_33020_0")
    prefix_of_mine = segment(tmp_path, "deepspeed_allreduce_buffer_0_localhost_3301_0")
    not_deepspeed = segment(tmp_path, "psm_localhost_33019_0")
    records = [rank_record(0, master_addr="localhost", master_port="33019"), None]
    removed = remove_item_segments(records, tmp_path)
    assert sorted(removed) == sorted(p.name for p in mine)
    assert not any(p.exists() for p in mine)
    assert other_item.exists() and prefix_of_mine.exists() and not_deepspeed.exists()


def test_ranks_that_recorded_no_rendezvous_remove_nothing(tmp_path: Path) -> None:
    kept = segment(tmp_path, "deepspeed_allreduce_buffer_0_localhost_33019_0")
    assert remove_item_segments([None, rank_record(1)], tmp_path) == []
    assert remove_item_segments([rank_record(0, master_addr="localhost", master_port=None)], tmp_path) == []
    assert kept.exists()
    assert remove_item_segments([rank_record(0, master_addr="localhost", master_port="1")], tmp_path / "absent") == []
