"""Checks on recorded failure texts, shared by the repros. Standard library only."""

from __future__ import annotations

import re
from dataclasses import dataclass

CHECKPOINT_ERROR = "torch.utils.checkpoint.CheckpointError"
RECOMPUTE_METADATA_PATTERN = (
    r"Recomputed values for the following tensors have different metadata "
    r"than during the forward pass"
)

_PAIR = re.compile(r"saved metadata:\s*(?P<saved>\{[^\n]*\})\s*\n\s*recomputed metadata:\s*(?P<recomputed>\{[^\n]*\})")
_SHAPE = re.compile(r"'shape':\s*torch\.Size\(\[(?P<dims>[^\]]*)\]\)")
_DTYPE = re.compile(r"'dtype':\s*(?P<dtype>torch\.\w+)")
_DEVICE = re.compile(r"'device':\s*(?P<device>device\([^)]*\))")


@dataclass(frozen=True)
class TensorMetadata:
    shape: tuple[int, ...] | None
    dtype: str | None
    device: str | None


@dataclass(frozen=True)
class MetadataMismatch:
    saved: TensorMetadata
    recomputed: TensorMetadata


def _parse_metadata(text: str) -> TensorMetadata:
    shape_m = _SHAPE.search(text)
    shape: tuple[int, ...] | None = None
    if shape_m:
        dims = [d.strip() for d in shape_m.group("dims").split(",") if d.strip()]
        try:
            shape = tuple(int(d) for d in dims)
        except ValueError:
            shape = None
    dtype_m = _DTYPE.search(text)
    device_m = _DEVICE.search(text)
    return TensorMetadata(
        shape=shape,
        dtype=dtype_m.group("dtype") if dtype_m else None,
        device=device_m.group("device") if device_m else None,
    )


def metadata_mismatches(message: str) -> list[MetadataMismatch]:
    """The saved/recomputed metadata pairs a CheckpointError message lists."""
    return [
        MetadataMismatch(_parse_metadata(m.group("saved")), _parse_metadata(m.group("recomputed")))
        for m in _PAIR.finditer(message)
    ]


def recomputed_shapes_are_empty(message: str) -> bool:
    """F1's symptom: every listed tensor recomputed as shape ``[0]`` from a non-empty
    saved shape, with dtype and device unchanged. At least one pair must be listed."""
    pairs = metadata_mismatches(message)
    if not pairs:
        return False
    for pair in pairs:
        if pair.recomputed.shape != (0,):
            return False
        if pair.saved.shape is None or pair.saved.shape == (0,):
            return False
        if pair.saved.dtype != pair.recomputed.dtype or pair.saved.device != pair.recomputed.device:
            return False
    return True


def recomputed_dtype_float32_bfloat16(message: str) -> bool:
    """F2's symptom: at least one listed tensor was saved in one of float32 / bfloat16 and
    recomputed in the other, with the same shape; no pair differs in shape."""
    pairs = metadata_mismatches(message)
    if not pairs:
        return False
    mixed = {"torch.float32", "torch.bfloat16"}
    found = False
    for pair in pairs:
        if pair.saved.shape != pair.recomputed.shape:
            return False
        if pair.saved.dtype != pair.recomputed.dtype:
            if {pair.saved.dtype, pair.recomputed.dtype} != mixed:
                return False
            found = True
    return found
