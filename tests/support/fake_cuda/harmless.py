"""Imports torch and asks only whether CUDA is there: safe to pre-import."""

import torch

AVAILABLE = torch.cuda.is_available()
