"""Sparsely-gated MoE routing (Shazeer et al. 2017; sigma-MoE paper Eq. 13-14)."""

import jax
import jax.numpy as jnp
from flax import nnx

from sparse_jax.layers.routers import routing


BALANCE_LOSSES = ("cv", "cv_squared")


def coefficient_of_variation(v_e: jax.Array, *, squared: bool) -> jax.Array:
  """`std / mean` of a vector, or its square `var / mean^2` (Shazeer et al.'s loss)."""
  cv2 = jnp.var(v_e) / (jnp.mean(v_e) ** 2 + 1e-10)
  return cv2 if squared else jnp.sqrt(cv2 + 1e-20)


class NoisyTopKRouter(routing.Router):
  """`H = x W3 + N(0,1) softplus(x W4)` (noise in training only); gates = `norm topk`,
  i.e. a softmax over the k largest noisy logits.

  The loss is the coefficient of variation (std / mean) of the gates summed over the batch,
  as the sigma-MoE paper's Eq. 14 writes it (`balance="cv"`; the paper's text defines CV as
  mean / std, which would reward imbalance; we take the standard definition). The authors'
  code has no such router to compare with. `balance="cv_squared"` is Shazeer et al.'s CV^2.
  """

  def __init__(self, d_model: int, n_experts: int, k: int, *, n_layers: int,
               reg_coef: float = 0.01, balance: str = "cv", rngs: nnx.Rngs):
    if balance not in BALANCE_LOSSES:
      raise ValueError(f"balance must be one of {BALANCE_LOSSES}; got {balance!r}.")
    super().__init__(d_model, n_experts, k, n_layers=n_layers, rngs=rngs)
    self.reg_coef, self.balance = reg_coef, balance
    # The noise net W4, zero at init as in Shazeer et al.
    self.w_noise = nnx.Param(jnp.zeros((n_experts, d_model)),
                             logical_axes=routing.SELECTOR_AXES)
    self.deterministic = False
    self.rngs = rngs["routing"].fork()

  def __call__(self, x_nd: jax.Array, *, seq_len: int | None = None) -> routing.Routing:
    logits_ne = routing.selector_logits(x_nd, self.w_sel[...])
    if not self.deterministic:
      noise_scale_ne = jax.nn.softplus(routing.selector_logits(x_nd, self.w_noise[...]))
      logits_ne = logits_ne + jax.random.normal(self.rngs(), logits_ne.shape) * noise_scale_ne
    top_nk, sel_nk = jax.lax.top_k(logits_ne, self.k)
    gates_nk = jax.nn.softmax(top_nk, axis=-1)
    importance_e = jnp.zeros((self.n_experts,), jnp.float32).at[sel_nk].add(gates_nk)
    reg = self.reg_coef * coefficient_of_variation(importance_e,
                                                   squared=self.balance == "cv_squared")
    return routing.Routing(sel_nk.astype(jnp.int32), gates_nk, reg)

  def flops_per_token(self) -> int:
    """The selector and the noise net, `d_model * E` multiply-adds each."""
    return 2 * super().flops_per_token()
