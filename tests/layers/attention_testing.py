"""Helpers shared by the attention layer tests."""

import jax
import jax.numpy as jnp
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
