"""The layer tests compare float32 against float64 references with float32 tolerances. On a
GPU, XLA multiplies float32 matrices in TF32 by default (a 10-bit mantissa: relative errors
near 1e-4, which failed five MoE-layer tests on an H200); these tests ask for full float32
products instead. On the CPU this changes nothing."""

import jax
import pytest


@pytest.fixture(autouse=True)
def _full_float32_matmuls():
  with jax.default_matmul_precision("highest"):
    yield
