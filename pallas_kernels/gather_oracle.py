"""The CVMM oracle: gather every slot's weight matrix, then one einsum.

    y[n, j] = x[n (, j)] @ w[sel[n, j]]        (gates: y[n] = sum_j gates[n, j] * y[n, j])

and the expert MLP as two such CVMMs, in slot order.

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


def expert_mlp_gather(x_nd, sel_nk, gates_nk, w_up_edg, w_down_egd, *, activation,
                      keep_nkg=None, dropout_rate: float = 0.0) -> jax.Array:
  """y[n] = sum_j gates[n, j] * drop(activation(x[n] @ w_up[e])) @ w_down[e], e = sel[n, j],
  with inverted dropout by the [N, k, G] keep mask (None: no dropout)."""
  a_nkg = activation(cvmm_gather(x_nd, sel_nk, w_up_edg))
  if keep_nkg is not None:
    a_nkg = jnp.where(keep_nkg, a_nkg / (1.0 - dropout_rate), 0.0).astype(x_nd.dtype)
  return cvmm_gather(a_nkg, sel_nk, w_down_egd, gates_nk)
