"""Imports a module that initialises CUDA: deferred with it."""

import cuda_at_import  # noqa: F401
