"""ZeRO stage 0's mixed-precision wrapper scales the loss and unscales only as it steps (DeepSpeed before 0.19
by 2**16 under bf16 too): a gradient read between backward and step is divided by that scale, or crosscheck
would report the wrapper's scale as a divergence (a gradient norm 65536 times the reference's)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from repros.trainer.fixed_trainer import _stage0_loss_scale


@pytest.mark.parametrize(
    ("optimizer", "scale"),
    [
        (SimpleNamespace(loss_scale=65536.0), 65536.0),  # FP16_UnfusedOptimizer of deepspeed 0.18 under bf16
        (SimpleNamespace(loss_scale=1.0), 1.0),  # deepspeed 0.19's bf16 loss-scale config
        (SimpleNamespace(), 1.0),  # a plain torch optimizer: nothing scaled
        (SimpleNamespace(loss_scale=None), 1.0),
        (SimpleNamespace(loss_scale=0), 1.0),
    ],
)
def test_the_gradient_is_read_at_the_scale_it_trains_at(optimizer: object, scale: float) -> None:
    assert _stage0_loss_scale(optimizer) == scale
