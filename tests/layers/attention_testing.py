"""Helpers shared by the attention layer tests."""

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx


def decode_all(attn, x_btd: jax.Array, max_len: int) -> jax.Array:
  """Decodes the tokens one by one from an empty cache with one jitted step."""
  graphdef, state = nnx.split(attn)

  @jax.jit
  def step(state, x_b1d, cache, position):
    return nnx.merge(graphdef, state).decode(x_b1d, cache, position)

  cache = attn.init_cache(x_btd.shape[0], max_len, jnp.float32)
  ys = []
  for t in range(x_btd.shape[1]):
    y_b1d, cache = step(state, x_btd[:, t:t + 1], cache, jnp.int32(t))
    ys.append(y_b1d)
  return jnp.concatenate(ys, axis=1)


def naive_rotary(x_c: np.ndarray, position: int) -> np.ndarray:
  """Rotates channel pair (j, j + C/2) by `position * 10000^(-2j/C)`, one pair at a time."""
  half = len(x_c) // 2
  out = x_c.copy()
  for j in range(half):
    theta = position * 10000.0 ** (-2.0 * j / len(x_c))
    out[j] = x_c[j] * np.cos(theta) - x_c[j + half] * np.sin(theta)
    out[j + half] = x_c[j + half] * np.cos(theta) + x_c[j] * np.sin(theta)
  return out
