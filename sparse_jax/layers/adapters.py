"""Bottleneck adapters, the parameter-efficient baselines of the SPARTAN paper (Sec. 4, App. A),
as AdapterHub builds them (the library the SPARTAN authors compared against).

An adapter's bottleneck is `A(z) = act(z W_down + b_down) W_up + b_up` with a `bottleneck`-wide
hidden layer (64 for d = 768, reduction factor 12). Only adapters (and the task head) train;
the backbone is frozen. An adapter sits on a sublayer (attention or FF) whose output is `h`
(after its dropout) and whose residual input is `x`; `adapted_residual` computes the
sublayer's result, with `LN` the sublayer's own pretrained LayerNorm in a post-LN layer
(RoBERTa) and the identity in a pre-LN block (our decoder LM):

- `original_ln_before=False` (Houlsby et al., 2019; AdapterHub `DoubleSeqBnConfig`): the
  adapter reads the sublayer's output, `LN(x + h + A(h))`.
- `original_ln_before=True` (Pfeiffer et al., 2021; AdapterHub `SeqBnConfig`, which also
  sets `residual_before_ln`): the adapter reads the normalised sum, `LN(x + h + A(LN(x + h)))`.
  The same pretrained LayerNorm runs twice.

`ADAPTERHUB_DEFAULTS` holds each kind's AdapterHub settings: Houlsby adapters after the
attention and after the FF with swish, Pfeiffer's after the FF only with ReLU and the normalised
input. Both are initialised as AdapterHub's default "bert" init: N(0, 0.02) weights, zero
biases; `init="near_identity"` is Houlsby et al.'s recipe instead (truncated N(0, 1e-2) down
projection, zero up projection, so an inserted adapter starts as the identity).

Tensor parallelism (`sparse_jax.parallel`) replicates an adapter on every device of `tensor`:
its bottleneck is declared `lowrank` (a rank-`b` map of the residual stream; `RULES` put that
on `fsdp` only), not `mlp`. Split Megatron-style by its hidden units, each adapter would add
an all-reduce of `B x T x d` to the forward (the up projection's partial sums) and one to the
backward (the down projection's input gradient), as many as a whole attention or FF
sublayer, for a map of `2 d b` multiply-adds per token (`b = d / 12`: 1/48 of a dense FF's
`8 d^2`). Replicated it reads the sublayer's output, which every device of `tensor` already
holds whole, computes the same values as one device and needs no collective at all; its
gradients too are whole on each device (the batch is not split over `tensor`).
"""

from typing import Callable

import jax
import jax.numpy as jnp
from flax import nnx

from sparse_jax import validation
from sparse_jax.layers.dense_ff import ACTIVATIONS
from sparse_jax.layers.param_types import PlugInParam

ADAPTERS_PER_LAYER = {"houlsby": 2, "pfeiffer": 1}
ADAPTERHUB_DEFAULTS = {"houlsby": {"activation": "swish", "original_ln_before": False},
                       "pfeiffer": {"activation": "relu", "original_ln_before": True}}
ADAPTER_INITS = ("bert", "near_identity")


def adapter_params(d_model: int, bottleneck: int, per_layer: int, n_layers: int) -> int:
  """Trainable scalars: `per_layer * n_layers` adapters of `2 d b + b + d` (weights, biases)."""
  return per_layer * n_layers * (2 * d_model * bottleneck + bottleneck + d_model)


class BottleneckAdapter(nnx.Module):
  """The bottleneck `A(z) = act(z W_down + b_down) W_up + b_up`, `z: [..., d_model]`, and
  where it reads (`original_ln_before`, module docstring); `activation` is one of
  `dense_ff.ACTIVATIONS`, `init` one of `ADAPTER_INITS`."""

  def __init__(self, d_model: int, bottleneck: int = 64, *, activation: str = "relu",
               original_ln_before: bool = False, init: str = "bert", rngs: nnx.Rngs):
    validation.require_positive_int(d_model, "d_model")
    validation.require_positive_int(bottleneck, "bottleneck")
    validation.require_choice(activation, "activation", ACTIVATIONS)
    validation.require_choice(init, "init", ADAPTER_INITS)
    self.d_model, self.bottleneck, self.activation = d_model, bottleneck, activation
    self.original_ln_before = original_ln_before
    down_key, up_key = rngs.params(), rngs.params()
    if init == "bert":
      w_down = 0.02 * jax.random.normal(down_key, (d_model, bottleneck))
      w_up = 0.02 * jax.random.normal(up_key, (bottleneck, d_model))
    else:
      w_down = 1e-2 * jax.random.truncated_normal(down_key, -2.0, 2.0, (d_model, bottleneck))
      w_up = jnp.zeros((bottleneck, d_model))
    # The bottleneck is `lowrank`, not `mlp`: replicated over `tensor` (module docstring).
    self.w_down = PlugInParam(w_down, logical_axes=("embed", "lowrank"))
    self.b_down = PlugInParam(jnp.zeros((bottleneck,)), logical_axes=("lowrank",))
    self.w_up = PlugInParam(w_up, logical_axes=("lowrank", "embed"))
    self.b_up = PlugInParam(jnp.zeros((d_model,)), logical_axes=("embed",))

  def __call__(self, z_btd: jax.Array) -> jax.Array:
    dtype = z_btd.dtype
    h_btb = ACTIVATIONS[self.activation](
        z_btd @ self.w_down[...].astype(dtype) + self.b_down[...].astype(dtype))
    return h_btb @ self.w_up[...].astype(dtype) + self.b_up[...].astype(dtype)

  def flops_per_token(self) -> int:
    """Multiply-adds of the down and up projections."""
    return 2 * self.d_model * self.bottleneck


def adapted_residual(adapter: BottleneckAdapter | None, h_btd: jax.Array, x_btd: jax.Array,
                     norm: Callable[[jax.Array], jax.Array] | None = None) -> jax.Array:
  """A sublayer's result from its output `h` and residual input `x` (module docstring):
  `LN(x + h)` without an adapter; `norm=None` is a pre-LN block's (no LayerNorm)."""
  norm = norm or (lambda y: y)
  if adapter is None:
    return norm(x_btd + h_btd)
  z_btd = norm(x_btd + h_btd) if adapter.original_ln_before else h_btd
  return norm(x_btd + h_btd + adapter(z_btd))
