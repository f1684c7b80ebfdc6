"""Initialises CUDA as it is imported where there is CUDA, as bitsandbytes does (``get_cuda_specs``)."""

import torch

CAPABILITY = torch.cuda.get_device_capability(0) if torch.cuda.is_available() else None
