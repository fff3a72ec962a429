"""Helpers for checking NNX layers against float64 numpy references."""

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx


def numpy_params(module: nnx.Module) -> dict:
  """The module's parameters as a nested dict of float64 numpy arrays."""
  return jax.tree.map(lambda a: np.asarray(a, np.float64),
                      nnx.to_pure_dict(nnx.state(module, nnx.Param)))


def float64_function(module: nnx.Module, call):
  """`(f, params64)` with `f(params, *args) = call(module with params, *args)`.

  Call inside `jax.enable_x64(True)`: the parameters are cast to float64, the other state
  (RNG streams) is kept as it is.
  """
  graphdef, params, rest = nnx.split(module, nnx.Param, ...)
  params64 = jax.tree.map(lambda a: jnp.asarray(a, jnp.float64), params)

  def f(params, *args):
    return call(nnx.merge(graphdef, params, rest), *args)

  return f, params64
