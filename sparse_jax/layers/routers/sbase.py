"""S-BASE routing (sigma-MoE paper Sec. 4): Sinkhorn-balanced assignment of sigmoid scores."""

import jax
import jax.numpy as jnp
from flax import nnx

from sparse_jax.layers.routers import routing


def sinkhorn(logits_ne: jax.Array, n_iters: int) -> jax.Array:
  """`[N, E]` log of a matrix with rows summing to 1/N and columns to 1/E (approximately).

  Alternating row and column normalisation of `exp(logits)` (Sinkhorn-Knopp) in log space:
  the entropic relaxation of BASE's balanced linear assignment (Eq. 19).
  """
  n, e = logits_ne.shape
  log_p = logits_ne.astype(jnp.float32)
  for _ in range(n_iters):
    log_p = log_p - jax.nn.logsumexp(log_p, axis=0, keepdims=True) - jnp.log(e)
    log_p = log_p - jax.nn.logsumexp(log_p, axis=1, keepdims=True) - jnp.log(n)
  return log_p


class SBaseRouter(routing.Router):
  """Scores `s = sigmoid(x W3^T)`. Training: experts are the top-k of the Sinkhorn-balanced
  assignment of the batch; evaluation: the plain top-k of s. Gates are always s. The
  regulariser is sigma-MoE's Eq. 20, as the paper uses for S-BASE."""

  def __init__(self, d_model: int, n_experts: int, k: int, *, n_layers: int,
               sinkhorn_iters: int = 3, reg_coef: float = 0.0, rngs: nnx.Rngs):
    super().__init__(d_model, n_experts, k, n_layers=n_layers, rngs=rngs)
    self.sinkhorn_iters, self.reg_coef = sinkhorn_iters, reg_coef
    self.deterministic = False

  def __call__(self, x_nd: jax.Array) -> routing.Routing:
    logits_ne = routing.selector_logits(x_nd, self.w_sel[...])
    scores_ne = jax.nn.sigmoid(logits_ne)
    if self.deterministic:
      _, sel_nk = jax.lax.top_k(scores_ne, self.k)
    else:
      balanced_ne = sinkhorn(jax.lax.stop_gradient(logits_ne), self.sinkhorn_iters)
      _, sel_nk = jax.lax.top_k(balanced_ne, self.k)
    gates_nk = routing.gather_gates(scores_ne, sel_nk)
    reg = self.reg_coef * routing.entropy_regularizer(logits_ne)
    return routing.Routing(sel_nk.astype(jnp.int32), gates_nk, reg)
