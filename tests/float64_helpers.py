"""Float64 versions of the helpers our layers compute in float32 (rotary positions, the
grouped matmul), for the tests that check a layer's wiring against the authors' float64
outputs (tests/layers/test_switchhead_authors.py, tests/models/test_moeut_authors.py)."""

import jax.numpy as jnp

from sparse_jax.layers import rotary


def apply_rotary_float64(x_bthc, positions_t, base=10000.0):
  """`rotary.apply_rotary` without its float32 casts (same formula)."""
  dim = x_bthc.shape[-1]
  inv_freq = base ** (-jnp.arange(0, dim, 2, dtype=x_bthc.dtype) / dim)
  angles = positions_t.astype(x_bthc.dtype)[:, None] * inv_freq[None, :]
  angles = jnp.concatenate([angles, angles], axis=-1)
  return x_bthc * jnp.cos(angles)[:, None, :] + rotary.rotate_half(x_bthc) * jnp.sin(angles)[
      :, None, :]


def cvmm_float64(x, sel, w, gates=None, *, impl):
  """The cvmm contract (`pallas_kernels.cvmm`) by gather, in the input dtype."""
  del impl
  w_nkml = jnp.take(w, sel, axis=0)
  spec = "nm,nkml->nkl" if x.ndim == 2 else "nkm,nkml->nkl"
  y_nkl = jnp.einsum(spec, x, w_nkml, precision="highest")
  return y_nkl if gates is None else jnp.einsum("nk,nkl->nl", gates, y_nkl, precision="highest")
