"""Switch Transformer routing (Fedus et al. 2022; sigma-MoE paper Sec. 4, Eq. 15-17)."""

import math

import jax
import jax.numpy as jnp
from flax import nnx

from sparse_jax.layers.routers import routing

BALANCE_LOSSES = ("authors", "eq17")


def capacity(n_tokens: int, n_experts: int, capacity_factor: float) -> int:
  """At most `ceil(mu * |B| / N_E)` tokens per expert."""
  return max(1, math.ceil(capacity_factor * n_tokens / n_experts))


def within_capacity(sel_n: jax.Array, n_experts: int, cap: int) -> jax.Array:
  """`[N]` bool: the token is among the first `cap` (in token order) routed to its expert."""
  one_hot_ne = jax.nn.one_hot(sel_n, n_experts, dtype=jnp.int32)
  position_n = jnp.take_along_axis(jnp.cumsum(one_hot_ne, axis=0), sel_n[:, None], 1)[:, 0]
  return position_n <= cap


def balance_loss(probs_ne: jax.Array, sel_n: jax.Array, form: str = "eq17") -> jax.Array:
  """The load-balancing loss from f, the fraction of tokens sent to each expert (Eq. 15,
  no gradient), and p, the mean selection probability (Eq. 16).

  eq17: `N_E f . p` (Fedus et al.). authors: `mean_{n, e}(softmax_ne f_e) = f . p / N_E`,
  what the sigma-MoE authors' code computes, `N_E^2` times weaker than Eq. 17.
  """
  n_experts = probs_ne.shape[-1]
  f_e = jnp.mean(jax.nn.one_hot(sel_n, n_experts, dtype=jnp.float32), axis=0)
  f_dot_p = jnp.dot(f_e, jnp.mean(probs_ne, axis=0))
  return n_experts * f_dot_p if form == "eq17" else f_dot_p / n_experts


class SwitchRouter(routing.Router):
  """Top-1 of `softmax(x W3^T)` without renormalisation and a load-balancing loss.

  The authors' runs (the defaults): no capacity limit (no token is dropped) and the
  `authors` form of the loss. `capacity_factor` mu (the paper's text) caps each expert at
  `ceil(mu N / N_E)` tokens; tokens over it get gate 0: the FF block outputs zero for them
  and only the residual passes. One expert per token: `k = 1`.
  """

  def __init__(self, d_model: int, n_experts: int, *, n_layers: int,
               capacity_factor: float | None = None, reg_coef: float = 0.01,
               balance: str = "authors", selector_init: str = "switch", rngs: nnx.Rngs):
    if balance not in BALANCE_LOSSES:
      raise ValueError(f"balance must be one of {BALANCE_LOSSES}; got {balance!r}.")
    super().__init__(d_model, n_experts, 1, n_layers=n_layers, selector_init=selector_init,
                     rngs=rngs)
    self.capacity_factor, self.reg_coef, self.balance = capacity_factor, reg_coef, balance

  def __call__(self, x_nd: jax.Array, *, seq_len: int | None = None) -> routing.Routing:
    logits_ne = routing.selector_logits(x_nd, self.w_sel[...])
    probs_ne = jax.nn.softmax(logits_ne, axis=-1)
    sel_n = jnp.argmax(probs_ne, axis=-1).astype(jnp.int32)
    gate_n = jnp.take_along_axis(probs_ne, sel_n[:, None], 1)[:, 0]
    dropped = jnp.zeros((), jnp.float32)  # The fraction of tokens over capacity.
    if self.capacity_factor is not None:
      cap = capacity(x_nd.shape[0], self.n_experts, self.capacity_factor)
      kept_n = within_capacity(sel_n, self.n_experts, cap)
      gate_n = jnp.where(kept_n, gate_n, 0.0)
      dropped = 1.0 - jnp.mean(kept_n.astype(jnp.float32))
    reg = self.reg_coef * balance_loss(probs_ne, sel_n, self.balance)
    return routing.Routing(sel_n[:, None], gate_n[:, None], reg, {"dropped_fraction": dropped})
