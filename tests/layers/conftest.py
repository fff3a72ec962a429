"""The layer tests compare float32 against float64 references with float32 tolerances: every
one runs with full float32 products (`full_float32_matmuls`, tests/conftest.py)."""

import pytest


@pytest.fixture(autouse=True)
def _every_layer_test_multiplies_in_float32(full_float32_matmuls):
  del full_float32_matmuls  # Requested for its context, active for the whole test.
