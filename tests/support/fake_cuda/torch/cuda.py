"""A stand-in ``torch.cuda``: ``is_available`` asks nothing (as torch's NVML-based check), the first
call that needs a device initialises it, as torch's ``_lazy_init`` does; a forked child of an
initialised process cannot use it (torch's ``_is_in_bad_fork``)."""

from __future__ import annotations

import os

_initialized = False
_initialized_in = 0


def is_available() -> bool:
    return os.environ.get("FAKE_CUDA_DEVICES", "1") != "0"


def is_initialized() -> bool:
    return _initialized and _initialized_in == os.getpid()


def in_bad_fork() -> bool:
    return _initialized and _initialized_in != os.getpid()


def _lazy_init() -> None:
    global _initialized, _initialized_in
    if not is_available():
        raise RuntimeError("Found no NVIDIA driver on your system")
    if in_bad_fork():
        raise RuntimeError("Cannot re-initialize CUDA in forked subprocess")
    if not _initialized:
        _initialized, _initialized_in = True, os.getpid()


def get_device_capability(device: int = 0) -> tuple[int, int]:
    _lazy_init()
    return (9, 0)
