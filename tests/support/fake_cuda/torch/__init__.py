"""A stand-in torch: only ``torch.cuda``, with an initialisation a test can watch (no real torch)."""

from . import cuda

__version__ = "0.0.0+stand-in"
__all__ = ["cuda"]
