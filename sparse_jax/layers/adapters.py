"""Bottleneck adapters, the parameter-efficient baselines of the SPARTAN paper (Sec. 4, App. A).

An adapter is `x + Up(act(Down(x)))` with a `bottleneck`-wide hidden layer (64 for d = 768,
reduction factor 12). Only adapters (and the task head) train; the backbone is frozen.

Placement in a post-LN encoder layer (RoBERTa), where a sublayer computes
`LayerNorm(h + Sublayer(h))`; the adapter wraps the sublayer's output before the residual add:
- Houlsby et al. (2019): two per layer, `LayerNorm(h + Adapter(AttnOutProj(...)))` after the
  attention's output projection and `LayerNorm(h + Adapter(FF(h)))` after the feed-forward.
- Pfeiffer et al. (2021): one per layer, after the feed-forward only, placed as above.
`ADAPTERS_PER_LAYER` records the count for `adapter_params`.
"""

import jax
import jax.numpy as jnp
from flax import nnx

from sparse_jax import validation
from sparse_jax.layers.dense_ff import ACTIVATIONS
from sparse_jax.layers.param_types import PlugInParam

ADAPTERS_PER_LAYER = {"houlsby": 2, "pfeiffer": 1}


def adapter_params(d_model: int, bottleneck: int, per_layer: int, n_layers: int) -> int:
  """Trainable scalars: `per_layer * n_layers` adapters of `2 d b + b + d` (weights, biases)."""
  return per_layer * n_layers * (2 * d_model * bottleneck + bottleneck + d_model)


class BottleneckAdapter(nnx.Module):
  """`y = x + (act(x W_down + b_down)) W_up + b_up`; `y = adapter(x)`, `x, y: [..., d_model]`.

  Init follows Houlsby et al.'s near-identity recipe: weights from a normal with std
  `init_std` (1e-2) truncated at two std, biases zero. With `zero_init_up=True` (default) the
  up projection starts at zero, so an inserted adapter is exactly the identity and the adapted
  model reproduces the frozen backbone at step 0. `activation` is "relu" or "gelu" (exact).
  """

  def __init__(self, d_model: int, bottleneck: int = 64, *, activation: str = "relu",
               zero_init_up: bool = True, init_std: float = 1e-2, rngs: nnx.Rngs):
    validation.require_positive_int(d_model, "d_model")
    validation.require_positive_int(bottleneck, "bottleneck")
    validation.require_choice(activation, "activation", ACTIVATIONS)
    self.d_model, self.bottleneck, self.activation = d_model, bottleneck, activation
    self.w_down = PlugInParam(_truncated_normal(rngs.params(), (d_model, bottleneck), init_std),
                            logical_axes=("embed", "mlp"))
    self.b_down = PlugInParam(jnp.zeros((bottleneck,)), logical_axes=("mlp",))
    w_up = (jnp.zeros((bottleneck, d_model)) if zero_init_up
            else _truncated_normal(rngs.params(), (bottleneck, d_model), init_std))
    self.w_up = PlugInParam(w_up, logical_axes=("mlp", "embed"))
    self.b_up = PlugInParam(jnp.zeros((d_model,)), logical_axes=("embed",))

  def __call__(self, x_btd: jax.Array) -> jax.Array:
    dtype = x_btd.dtype
    h_btb = ACTIVATIONS[self.activation](
        x_btd @ self.w_down[...].astype(dtype) + self.b_down[...].astype(dtype))
    return x_btd + h_btb @ self.w_up[...].astype(dtype) + self.b_up[...].astype(dtype)

  def flops_per_token(self) -> int:
    """Multiply-adds of the down and up projections."""
    return 2 * self.d_model * self.bottleneck


def _truncated_normal(key: jax.Array, shape, std: float) -> jax.Array:
  return std * jax.random.truncated_normal(key, -2.0, 2.0, shape)
