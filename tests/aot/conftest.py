"""Setup shared by the compile-for-a-target tests."""

import jax
import pytest


@pytest.fixture(autouse=True)
def _no_persistent_cache():
  """Executables compiled for absent devices cannot be read back from the session's cache."""
  jax.config.update("jax_enable_compilation_cache", False)
  yield
  jax.config.update("jax_enable_compilation_cache", True)
