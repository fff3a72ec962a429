"""Switch Transformer routing (Fedus et al. 2022; sigma-MoE paper Sec. 4, Eq. 15-17)."""

import math

import jax
import jax.numpy as jnp
from flax import nnx

from sparse_jax.layers.routers import routing


def capacity(n_tokens: int, n_experts: int, capacity_factor: float) -> int:
  """At most `ceil(mu * |B| / N_E)` tokens per expert."""
  return max(1, math.ceil(capacity_factor * n_tokens / n_experts))


def within_capacity(sel_n: jax.Array, n_experts: int, cap: int) -> jax.Array:
  """`[N]` bool: the token is among the first `cap` (in token order) routed to its expert."""
  one_hot_ne = jax.nn.one_hot(sel_n, n_experts, dtype=jnp.int32)
  position_n = jnp.take_along_axis(jnp.cumsum(one_hot_ne, axis=0), sel_n[:, None], 1)[:, 0]
  return position_n <= cap


def balance_loss(probs_ne: jax.Array, sel_n: jax.Array) -> jax.Array:
  """Eq. 17: `N_E f . p`, f the fraction of tokens sent to each expert (Eq. 15), p the mean
  selection probability (Eq. 16)."""
  n_experts = probs_ne.shape[-1]
  f_e = jnp.mean(jax.nn.one_hot(sel_n, n_experts, dtype=jnp.float32), axis=0)
  p_e = jnp.mean(probs_ne, axis=0)
  return n_experts * jnp.dot(f_e, p_e)


class SwitchRouter(routing.Router):
  """Top-1 of `softmax(x W3^T)` without renormalisation, a hard capacity, Eq. 17's loss.

  Tokens over an expert's capacity get gate 0: the FF block outputs zero for them and only
  the residual passes. One expert per token: `k = 1`.
  """

  def __init__(self, d_model: int, n_experts: int, *, n_layers: int, capacity_factor: float,
               reg_coef: float = 0.01, rngs: nnx.Rngs):
    super().__init__(d_model, n_experts, 1, n_layers=n_layers, rngs=rngs)
    self.capacity_factor, self.reg_coef = capacity_factor, reg_coef

  def __call__(self, x_nd: jax.Array) -> routing.Routing:
    logits_ne = routing.selector_logits(x_nd, self.w_sel[...])
    probs_ne = jax.nn.softmax(logits_ne, axis=-1)
    sel_n = jnp.argmax(probs_ne, axis=-1).astype(jnp.int32)
    gate_n = jnp.take_along_axis(probs_ne, sel_n[:, None], 1)[:, 0]
    cap = capacity(x_nd.shape[0], self.n_experts, self.capacity_factor)
    gate_n = jnp.where(within_capacity(sel_n, self.n_experts, cap), gate_n, 0.0)
    reg = self.reg_coef * balance_loss(probs_ne, sel_n)
    return routing.Routing(sel_n[:, None], gate_n[:, None], reg)
