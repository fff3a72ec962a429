"""Sphinx configuration of the API reference (docs/api/README.md says how to build it)."""

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.join(HERE, "_ext"), os.path.dirname(os.path.dirname(HERE))]
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import sparse_jax  # pylint: disable=wrong-import-position

project = "sparse_jax"
author = "The sparse_jax Authors"
copyright = "2026, The sparse_jax Authors"  # pylint: disable=redefined-builtin
release = version = sparse_jax.__version__

extensions = ["sphinx.ext.autodoc", "sphinx.ext.napoleon", "sphinx.ext.doctest",
              "schema_reference"]
# Our docstrings are prose with `name` for code: read single backquotes as code.
default_role = "code"
autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_default_options = {"members": True, "show-inheritance": False}
napoleon_google_docstring = True
napoleon_numpy_docstring = False
# The examples in docstrings (`>>>`) run under `sphinx-build -b doctest`, each module's with
# these names imported.
doctest_global_setup = """
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
"""
exclude_patterns = ["_build", "README.md"]
html_theme = "alabaster"
