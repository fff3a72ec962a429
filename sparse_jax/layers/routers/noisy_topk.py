"""Sparsely-gated MoE routing (Shazeer et al. 2017; sigma-MoE paper Eq. 13-14)."""

import jax
import jax.numpy as jnp
from flax import nnx

from sparse_jax.layers.routers import routing


def cv_squared(v_e: jax.Array) -> jax.Array:
  """Squared coefficient of variation `var / mean^2` of a vector (Shazeer's balance loss)."""
  return jnp.var(v_e) / (jnp.mean(v_e) ** 2 + 1e-10)


class NoisyTopKRouter(routing.Router):
  """`H = x W3 + N(0,1) softplus(x W4)` (noise in training only); gates = `norm topk`,
  i.e. a softmax over the k largest noisy logits; loss CV^2 of the summed gates (Eq. 14)."""

  def __init__(self, d_model: int, n_experts: int, k: int, *, n_layers: int,
               reg_coef: float = 0.01, rngs: nnx.Rngs):
    super().__init__(d_model, n_experts, k, n_layers=n_layers, rngs=rngs)
    self.reg_coef = reg_coef
    # The noise net W4, zero at init as in Shazeer et al.
    self.w_noise = nnx.Param(jnp.zeros((n_experts, d_model)),
                             logical_axes=routing.SELECTOR_AXES)
    self.deterministic = False
    self.rngs = rngs["routing"].fork()

  def __call__(self, x_nd: jax.Array) -> routing.Routing:
    logits_ne = routing.selector_logits(x_nd, self.w_sel[...])
    if not self.deterministic:
      noise_scale_ne = jax.nn.softplus(routing.selector_logits(x_nd, self.w_noise[...]))
      logits_ne = logits_ne + jax.random.normal(self.rngs(), logits_ne.shape) * noise_scale_ne
    top_nk, sel_nk = jax.lax.top_k(logits_ne, self.k)
    gates_nk = jax.nn.softmax(top_nk, axis=-1)
    importance_e = jnp.zeros((self.n_experts,), jnp.float32).at[sel_nk].add(gates_nk)
    reg = self.reg_coef * cv_squared(importance_e)
    return routing.Routing(sel_nk.astype(jnp.int32), gates_nk, reg)

  def flops_per_token(self) -> int:
    """The selector and the noise net, `d_model * E` multiply-adds each."""
    return 2 * super().flops_per_token()
