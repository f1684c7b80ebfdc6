"""The Scenario fields F6-F10 added are plain data whose defaults leave F1-F5's scenarios as they were."""

from __future__ import annotations

import dataclasses

import pytest

from repros.trainer.scenario import Scenario

#: Fields added for F6-F10, with the default that keeps the earlier behaviour.
ADDED = {
    "checkpointing_before_adapter": False,
    "ddp_find_unused_parameters": False,
    "ddp_static_graph": False,
    "fsdp1_wrap": "layer",
    "fsdp1_use_orig_params": False,
    "trainer_loop": "own",
    "zero_init": False,
    "add_tokens": 0,
    "pad_to_multiple_of": None,
    "batch_holds_added_token": False,
    "modules_to_save": (),
    "save_adapter": False,
    "save_method": "default",
    "zero3_gather_16bit_on_save": False,
}


def test_added_fields_default_to_the_earlier_behaviour() -> None:
    defaults = {f.name: f.default for f in dataclasses.fields(Scenario)}
    assert {name: defaults[name] for name in ADDED} == ADDED


def test_every_field_is_plain_data() -> None:
    # A grid or a cost variant sets them by name from YAML: only str, int, float, bool, None, tuples.
    for value in dataclasses.asdict(Scenario()).values():
        assert value is None or isinstance(value, (str, int, float, bool, tuple))


@pytest.mark.parametrize(
    "fields",
    [
        {"engine": "fsdp3"},
        {"engine": "fsdp1", "fsdp1_wrap": "block"},
        {"trainer_loop": "accelerate"},
        {"engine": "ddp", "trainer_loop": "hf"},
        {"save_method": "consolidated"},
    ],
)
def test_unknown_values_are_refused(fields: dict) -> None:
    with pytest.raises(ValueError):
        Scenario(**fields)
