"""Setup shared by the compile-for-a-target tests."""

import jax
import pytest


@pytest.fixture(autouse=True)
def _production_compiles():
  """Executables compiled for absent devices cannot be read back from the session's
  persistent cache, so it is off. And what these tests check (kernel registers and spills,
  XLA:GPU's Triton GEMM fusion, memory) is what training compiles: XLA optimises, unlike in
  the rest of the suite."""
  saved = {name: jax.config.values[name]
           for name in ("jax_enable_compilation_cache", "jax_disable_most_optimizations")}
  jax.config.update("jax_enable_compilation_cache", False)
  jax.config.update("jax_disable_most_optimizations", False)
  yield
  for name, value in saved.items():
    jax.config.update(name, value)
