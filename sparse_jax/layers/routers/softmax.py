"""Softmax routing (Sec. 4): top-k after softmax, with or without renormalisation."""

import jax
import jax.numpy as jnp
from flax import nnx

from sparse_jax.layers.routers import routing


class SoftmaxRouter(routing.Router):
  """`p = softmax(x W3^T)`; top-k of p; gates `p` (`renorm=False`) or `norm topk(p)`.

  With `renorm=True` the k kept probabilities are renormalised to sum to 1 (App. A.1), which
  equals a softmax over the k largest logits. The regulariser is sigma-MoE's Eq. 20.
  """

  def __init__(self, d_model: int, n_experts: int, k: int, *, n_layers: int, renorm: bool,
               reg_coef: float = 0.0, rngs: nnx.Rngs):
    super().__init__(d_model, n_experts, k, n_layers=n_layers, rngs=rngs)
    self.renorm, self.reg_coef = renorm, reg_coef

  def __call__(self, x_nd: jax.Array) -> routing.Routing:
    logits_ne = routing.selector_logits(x_nd, self.w_sel[...])
    top_logits_nk, sel_nk = jax.lax.top_k(logits_ne, self.k)
    if self.renorm:
      gates_nk = jax.nn.softmax(top_logits_nk, axis=-1)
    else:
      gates_nk = routing.gather_gates(jax.nn.softmax(logits_ne, axis=-1), sel_nk)
    reg = self.reg_coef * routing.entropy_regularizer(logits_ne)
    return routing.Routing(sel_nk.astype(jnp.int32), gates_nk, reg)
