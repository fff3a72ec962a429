"""Softmax routing (Sec. 4): top-k after softmax, with or without renormalisation."""

import jax
import jax.numpy as jnp
from flax import nnx

from sparse_jax.layers.routers import routing

REG_LOGITS = ("authors", "all")


def selected_logits_by_expert(logits_ne: jax.Array, sel_nk: jax.Array) -> jax.Array:
  """`[N, k]` the logits of the selected experts in increasing expert id.

  The authors' regulariser for softmax after top-k reads the k selected logits in the order
  their (unsorted) top-k returns them, which the PyTorch docs leave unspecified; expert-id
  order is a fixed choice with the same property: a position does not mean a rank.
  """
  return routing.gather_gates(logits_ne, jnp.sort(sel_nk, axis=-1))


class SoftmaxRouter(routing.Router):
  """`p = softmax(x W3^T)`; top-k of p; gates `p` (`renorm=False`) or `norm topk(p)`.

  With `renorm=True` the k kept probabilities are renormalised to sum to 1 (App. A.1), which
  equals a softmax over the k largest logits. Expert dropout (the authors' sweeps) drops
  experts before the top-k: probabilities become 0 without renormalisation (a dropped expert
  still picked has gate 0), logits become -inf with it.

  The regulariser is sigma-MoE's Eq. 20, times `reg_coef`. `reg_logits="authors"`: with
  renormalisation it reads only the k selected logits (`selected_logits_by_expert`), as
  the authors' code does (nearly constant: those runs were effectively unregularised);
  without, all logits. `"all"`: all logits in both cases, as the paper's text says.
  """

  def __init__(self, d_model: int, n_experts: int, k: int, *, n_layers: int, renorm: bool,
               reg_coef: float = 0.0, expert_dropout: float = 0.0, reg_logits: str = "authors",
               rngs: nnx.Rngs):
    if reg_logits not in REG_LOGITS:
      raise ValueError(f"reg_logits must be one of {REG_LOGITS}; got {reg_logits!r}.")
    super().__init__(d_model, n_experts, k, n_layers=n_layers, rngs=rngs)
    self.renorm, self.reg_coef, self.reg_logits = renorm, reg_coef, reg_logits
    self.expert_dropout = expert_dropout
    self.deterministic = False
    self.rngs = rngs["routing"].fork()

  def _drop(self, scores_ne: jax.Array, fill: float) -> jax.Array:
    if self.expert_dropout > 0 and not self.deterministic:
      return routing.drop_experts(self.rngs(), scores_ne, self.expert_dropout, fill)
    return scores_ne

  def __call__(self, x_nd: jax.Array, *, seq_len: int | None = None) -> routing.Routing:
    logits_ne = routing.selector_logits(x_nd, self.w_sel[...])
    reg_logits = logits_ne
    if self.renorm:
      _, sel_nk = jax.lax.top_k(self._drop(logits_ne, -jnp.inf), self.k)
      gates_nk = jax.nn.softmax(routing.gather_gates(logits_ne, sel_nk), axis=-1)
      if self.reg_logits == "authors":
        reg_logits = selected_logits_by_expert(logits_ne, sel_nk)
    else:
      gates_nk, sel_nk = jax.lax.top_k(self._drop(jax.nn.softmax(logits_ne, axis=-1), 0.0),
                                       self.k)
    reg = self.reg_coef * routing.entropy_regularizer(reg_logits)
    return routing.Routing(sel_nk.astype(jnp.int32), gates_nk, reg)
