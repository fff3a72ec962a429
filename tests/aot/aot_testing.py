"""Skips of the compile-for-a-target tests without the compile extra."""

import importlib.util

import pytest

_GPU = importlib.util.find_spec("jax_cuda12_plugin") is not None
_TPU = importlib.util.find_spec("libtpu") is not None
needs_gpu = pytest.mark.skipif(not _GPU, reason="compile extra not installed (jax_cuda12_plugin)")
needs_tpu = pytest.mark.skipif(not _TPU, reason="compile extra not installed (libtpu)")

