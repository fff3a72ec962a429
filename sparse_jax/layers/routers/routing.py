"""What every router is and returns, and the pieces several routers share."""

import math

import flax.struct
import jax
import jax.numpy as jnp
from flax import nnx

from sparse_jax.layers import initializers
from sparse_jax.layers.precision import f32_einsum


@flax.struct.dataclass
class Routing:
  """A router's decision for N tokens.

  Attributes:
    sel_nk: `[N, k]` int32 expert ids.
    gates_nk: `[N, k]` float32 weights of the experts' outputs (0 drops a slot).
    reg_loss: scalar regulariser, already multiplied by the router's coefficient.
    stats: the router's own scalar diagnostics of this decision (Switch: `dropped_fraction`;
      S-BASE: `rerouted_fraction`), which `MoE` adds to its aux for routing health.
    logits_ne: `[N, E]` float32 selector logits, for a regulariser over more than this call
      (MoEUT's, across a shared layer's repeats: `models.moeut_regularizer`); sigma only.
  """

  sel_nk: jax.Array
  gates_nk: jax.Array
  reg_loss: jax.Array
  stats: dict[str, jax.Array] = flax.struct.field(default_factory=dict)
  logits_ne: jax.Array | None = None


def equal_norm_rows(key: jax.Array, shape: tuple[int, int], std: float) -> jax.Array:
  """`[E, d]` selector init of sigma-MoE Sec. 5: rows of equal norm, whole matrix at `std`.

  N(0, 1) rows are scaled to unit norm, then the matrix is rescaled to have standard
  deviation `std`, so initial scores depend only on the angle between x and each row.
  """
  w = jax.random.normal(key, shape)
  w = w / jnp.linalg.norm(w, axis=1, keepdims=True)
  return w * (std / jnp.std(w))


def selector_logits(x_nd: jax.Array, w_ed: jax.Array) -> jax.Array:
  """`x W3^T` in float32: `[N, d] x [E, d] -> [N, E]`."""
  return f32_einsum("nd,ed->ne", x_nd, w_ed.astype(x_nd.dtype))


def entropy_regularizer(logits_ne: jax.Array) -> jax.Array:
  """sigma-MoE Eq. 20: `sum_e p[e] log p[e]`, `p` the batch mean of `softmax(logits)`.

  The mean is taken in log space (logsumexp over tokens minus log N) for stability.
  """
  n = logits_ne.shape[0]
  logp_ne = jax.nn.log_softmax(logits_ne.astype(jnp.float32), axis=-1)
  log_mean_e = jax.nn.logsumexp(logp_ne, axis=0) - math.log(n)
  return jnp.sum(jnp.exp(log_mean_e) * log_mean_e)


def usage_counts(sel_nk: jax.Array, gates_nk: jax.Array, n_experts: int) -> jax.Array:
  """`[E]` how many token slots each expert processes (slots with gate 0 do not count)."""
  active = (gates_nk != 0).astype(jnp.int32)
  return jnp.zeros((n_experts,), jnp.int32).at[sel_nk].add(active)


def gather_gates(scores_ne: jax.Array, sel_nk: jax.Array) -> jax.Array:
  return jnp.take_along_axis(scores_ne, sel_nk, axis=-1)


def drop_experts(key: jax.Array, scores_ne: jax.Array, rate: float, fill: float) -> jax.Array:
  """Expert dropout (sigma-MoE Eq. 22): each (token, expert) score becomes `fill` with
  probability `rate`, with no rescaling, so a top-k over the result skips dropped experts.

  `fill` is what the authors' code writes: 0 for sigmoid scores and softmax probabilities
  (an expert picked although dropped, possible only when more than `E - k` are dropped, then
  gets gate 0) and `-inf` for raw logits and balanced assignments.
  """
  dropped_ne = jax.random.bernoulli(key, rate, scores_ne.shape)
  return jnp.where(dropped_ne, jnp.asarray(fill, scores_ne.dtype), scores_ne)


# A selector's rows score the experts; they stay whole on every device (`sparse_jax.parallel`).
SELECTOR_AXES = ("expert_scores", "embed")


# How a router's selector `W3` starts; `MoE`'s expert inits of the same names match them.
SELECTOR_INITS = ("sigma", "switch", "fedus")


def selector_param(rngs, n_experts: int, d_model: int, n_layers: int,
                   init: str = "sigma") -> nnx.Param:
  """The `[E, d_model]` selector `W3`.

  sigma (Sec. 5): rows of equal norm, the matrix at the std of `W1`, `sqrt(2 / (d_model L))`.
  switch (the authors' Switch runs): N(0, 0.2 / (d_model L)), rows not renormalised (their
  depth-scaled init with scale 0.1). fedus (Fedus et al.): N(0, 0.1 / d_model).
  """
  if init not in SELECTOR_INITS:
    raise ValueError(f"selector init must be one of {SELECTOR_INITS}; got {init!r}.")
  key, shape = rngs.params(), (n_experts, d_model)
  if init == "sigma":
    w = equal_norm_rows(key, shape, initializers.depth_scaled_std(d_model, n_layers))
  else:
    std = (math.sqrt(0.1) * initializers.depth_scaled_std(d_model, n_layers)
           if init == "switch" else math.sqrt(0.1 / d_model))
    w = jax.nn.initializers.normal(std)(key, shape)
  return nnx.Param(w, logical_axes=SELECTOR_AXES)


class Router(nnx.Module):
  """The router contract that `MoE` relies on, and what every router shares.

  `router(x_nd, seq_len=T)` maps tokens `[N, d_model]` (N = B * T: B sequences of T
  tokens, in order) to a `Routing` of `k` slots per token over `n_experts` experts;
  `flops_per_token()` is the router's multiply-adds per token. Every router scores tokens
  with a selector `w_sel [E, d_model]` (`x W3^T`: `d_model * E` multiply-adds); subclasses
  add their own parameters, randomness and `__call__`. Only S-BASE uses `seq_len`.
  """

  def __init__(self, d_model: int, n_experts: int, k: int, *, n_layers: int,
               selector_init: str = "sigma", rngs: nnx.Rngs):
    self.d_model, self.n_experts, self.k = d_model, n_experts, k
    self.w_sel = selector_param(rngs, n_experts, d_model, n_layers, selector_init)

  def __call__(self, x_nd: jax.Array, *, seq_len: int | None = None) -> Routing:
    raise NotImplementedError(f"{type(self).__name__} must define __call__.")

  def flops_per_token(self) -> int:
    """Multiply-adds of the selector `x W3^T`."""
    return self.d_model * self.n_experts
