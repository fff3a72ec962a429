"""Weight initialisers shared by the layers."""

import math

import jax
import jax.numpy as jnp


def depth_scaled_std(fan_in: int, n_layers: int) -> float:
  """std = sqrt(2 / (fan_in * n_layers)): the dense init of the sigma-MoE paper, Sec. 5."""
  return math.sqrt(2.0 / (fan_in * n_layers))


def normal(std: float):
  """An NNX-style initialiser `(key, shape, dtype) -> array` drawing N(0, std^2)."""

  def init(key: jax.Array, shape, dtype=jnp.float32) -> jax.Array:
    return std * jax.random.normal(key, shape, dtype)

  return init
