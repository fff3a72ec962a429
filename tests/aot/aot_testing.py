"""Helpers of the compile-for-a-target tests: skips without the compile extra, meshes."""

import importlib.util

import jax
import pytest

from sparse_jax.aot import targets

_GPU = importlib.util.find_spec("jax_cuda12_plugin") is not None
_TPU = importlib.util.find_spec("libtpu") is not None
needs_gpu = pytest.mark.skipif(not _GPU, reason="compile extra not installed (jax_cuda12_plugin)")
needs_tpu = pytest.mark.skipif(not _TPU, reason="compile extra not installed (libtpu)")


def one_device_mesh(target: targets.Target) -> jax.sharding.Mesh:
  """A mesh over the first of `target`'s abstract devices."""
  return jax.sharding.Mesh(targets.target_devices(target)[:1], ("x",))
