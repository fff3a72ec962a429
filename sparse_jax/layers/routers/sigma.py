"""sigma-MoE routing (Sec. 5): sigmoid scores, expert dropout, top-k, entropy regulariser."""

import jax
import jax.numpy as jnp
from flax import nnx

from sparse_jax.layers.routers import routing


class SigmaRouter(routing.Router):
  """`s = sigmoid(x W3^T)`; top-k of s picks the experts and s weights them (Eq. 11).

  Expert dropout (Eq. 22): in training, each (token, expert) score is set to 0 before the
  top-k with probability `expert_dropout`, removing whole experts for that token with no
  rescaling; as in the authors' code, an expert picked although dropped (only when more than
  `E - k` are) has gate 0. The regulariser is Eq. 20 on the raw selector logits, times
  `reg_coef`.
  """

  def __init__(self, d_model: int, n_experts: int, k: int, *, n_layers: int,
               expert_dropout: float = 0.0, reg_coef: float = 0.0, rngs: nnx.Rngs):
    super().__init__(d_model, n_experts, k, n_layers=n_layers, rngs=rngs)
    self.expert_dropout, self.reg_coef = expert_dropout, reg_coef
    self.deterministic = False
    self.rngs = rngs["routing"].fork()

  def __call__(self, x_nd: jax.Array, *, seq_len: int | None = None) -> routing.Routing:
    logits_ne = routing.selector_logits(x_nd, self.w_sel[...])
    scores_ne = jax.nn.sigmoid(logits_ne)
    if self.expert_dropout > 0 and not self.deterministic:
      scores_ne = routing.drop_experts(self.rngs(), scores_ne, self.expert_dropout, 0.0)
    gates_nk, sel_nk = jax.lax.top_k(scores_ne, self.k)
    reg = self.reg_coef * routing.entropy_regularizer(logits_ne)
    return routing.Routing(sel_nk.astype(jnp.int32), gates_nk, reg, logits_ne=logits_ne)
