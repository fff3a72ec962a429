"""The CVMM oracle: gather every slot's weight matrix, then one einsum.

    y[n, j] = x[n (, j)] @ w[sel[n, j]]        (gates: y[n] = sum_j gates[n, j] * y[n, j])

Materialises `w[sel]` ([N, k, M, L]), so it is only for tests and small shapes; JAX
differentiates it directly. Computes in f32 (so its gradients, including the scatter-add into
dw, accumulate in f32 too) and returns the input dtype, like the others.
"""

import jax
import jax.numpy as jnp


def cvmm_gather(x: jax.Array, sel_nk: jax.Array, w_eml: jax.Array,
                gates_nk: jax.Array | None = None) -> jax.Array:
  """CVMM by explicit gather (x [N, M] or [N, k, M]; returns [N, k, L] or, with gates, [N, L])."""
  w_nkml = jnp.take(w_eml.astype(jnp.float32), sel_nk, axis=0)
  spec = "nm,nkml->nkl" if x.ndim == 2 else "nkm,nkml->nkl"
  y_nkl = jnp.einsum(spec, x.astype(jnp.float32), w_nkml, precision="highest")
  if gates_nk is None:
    return y_nkl.astype(x.dtype)
  y_nl = jnp.einsum("nk,nkl->nl", gates_nk.astype(jnp.float32), y_nkl)
  return y_nl.astype(x.dtype)
