"""Weight initialisers shared by the layers."""

import math

import jax
from flax import nnx


HEAD_IN_AXES = ("embed", "heads", "head_dim")  # A projection into heads, `[d, H, Dh]`.
HEAD_OUT_AXES = ("heads", "head_dim", "embed")  # An output projection, `[H, Dh, d]`.


def depth_scaled_std(fan_in: int, n_layers: int) -> float:
  """std = sqrt(2 / (fan_in * n_layers)): the dense init of the sigma-MoE paper, Sec. 5."""
  return math.sqrt(2.0 / (fan_in * n_layers))


def head_projections(d_model: int, n_heads: int, head_dim: int, *, n_layers: int,
                     n_inputs: int, rngs: nnx.Rngs) -> tuple[nnx.Param, ...]:
  """An attention layer's `n_inputs` projections into heads, `[d_model, H, Dh]` each (Q, K,
  V, ...), then its output projection `[H, Dh, d_model]`, drawn in that order with the
  depth-scaled init of their fan-in, each declaring its logical axes."""
  in_init = jax.nn.initializers.normal(depth_scaled_std(d_model, n_layers))
  out_init = jax.nn.initializers.normal(depth_scaled_std(n_heads * head_dim, n_layers))
  inputs = [nnx.Param(in_init(rngs.params(), (d_model, n_heads, head_dim)),
                      logical_axes=HEAD_IN_AXES) for _ in range(n_inputs)]
  out = nnx.Param(out_init(rngs.params(), (n_heads, head_dim, d_model)),
                  logical_axes=HEAD_OUT_AXES)
  return (*inputs, out)
