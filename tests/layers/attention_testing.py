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


def naive_conv(y_tsm: np.ndarray, kernel: np.ndarray, bias: np.ndarray) -> np.ndarray:
  """Explicit loop over the kernel taps: tap a reads token `t - (F_len-1) + a`, tap b reads
  module `s - (F_mod-1)//2 + b`; taps outside the sequence or the modules read zeros."""
  f_len, f_mod = kernel.shape[:2]
  n_t, n_s, _ = y_tsm.shape
  out = np.zeros_like(y_tsm)
  for t in range(n_t):
    for s in range(n_s):
      out[t, s] = bias
      for a in range(f_len):
        for b in range(f_mod):
          tt, ss = t - (f_len - 1) + a, s - (f_mod - 1) // 2 + b
          if tt >= 0 and 0 <= ss < n_s:
            out[t, s] += y_tsm[tt, ss] @ kernel[a, b]
  return out
