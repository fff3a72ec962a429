"""Rotary position embedding (Su et al. 2021, RoFormer), rotate-half form.

Channel pair `(j, j + C/2)` of a query or key at position p is rotated by the angle
`p * base^(-2j/C)`. A rotation by `p` on the query and by `p'` on the key leaves the dot product
depending on `p' - p` only, so attention sees relative positions, and a cached key never needs
re-encoding when later tokens arrive. `apply_partial_rotary` rotates only the first channels
of each head (the SwitchHead and MoEUT authors' RoPE, half of them by default).
"""

import jax
import jax.numpy as jnp


def rotary_cos_sin(positions_t: jax.Array, dim: int, base: float = 10000.0):
  """`[T] -> (cos, sin)`, each `[T, dim]`: both halves of the channels share the angles."""
  inv_freq = base ** (-jnp.arange(0, dim, 2, dtype=jnp.float32) / dim)
  angles_tf = positions_t.astype(jnp.float32)[:, None] * inv_freq[None, :]
  angles_tc = jnp.concatenate([angles_tf, angles_tf], axis=-1)
  return jnp.cos(angles_tc), jnp.sin(angles_tc)


def rotate_half(x: jax.Array) -> jax.Array:
  """`[x1, x2] -> [-x2, x1]` on the last axis: a quarter turn of every channel pair."""
  x1, x2 = jnp.split(x, 2, axis=-1)
  return jnp.concatenate([-x2, x1], axis=-1)


def apply_rotary(x_bthc: jax.Array, positions_t: jax.Array, base: float = 10000.0) -> jax.Array:
  """Rotates `[B, T, H, C]` queries or keys, row t by its absolute position `positions_t[t]`."""
  cos_tc, sin_tc = rotary_cos_sin(positions_t, x_bthc.shape[-1], base)
  x32 = x_bthc.astype(jnp.float32)
  rotated = x32 * cos_tc[:, None, :] + rotate_half(x32) * sin_tc[:, None, :]
  return rotated.astype(x_bthc.dtype)


def rotated_channels(fraction: float, head_dim: int) -> int:
  """How many leading channels a `fraction` of a head rotates: `int(fraction * head_dim)`
  rounded down to even (channels rotate in pairs), as the MoEUT authors' training code does
  (`layers/transformer/fast_rope_attention.py`)."""
  n_rotate = int(fraction * head_dim)
  return n_rotate - n_rotate % 2


def apply_partial_rotary(x_bthc: jax.Array, positions_t: jax.Array, n_rotate: int,
                         base: float = 10000.0) -> jax.Array:
  """`apply_rotary` on the first `n_rotate` channels (their own frequencies, over
  `n_rotate`), the others as they are."""
  if n_rotate == x_bthc.shape[-1]:
    return apply_rotary(x_bthc, positions_t, base)
  rotated = apply_rotary(x_bthc[..., :n_rotate], positions_t, base)
  return jnp.concatenate([rotated, x_bthc[..., n_rotate:]], axis=-1)
