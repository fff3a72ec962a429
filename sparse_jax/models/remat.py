"""Rematerialisation (`model.remat`): trade compute for activation memory, per block.

- `none`: the backward pass reads every activation the forward pass stored;
- `block`: each block stores only its input; the backward pass recomputes the block
  (`jax.checkpoint_policies.nothing_saveable`): activation memory of one block plus the
  residual stream per layer, about one more forward pass of compute;
- `dots`: each block also keeps the outputs of its weight matmuls (dots without batch
  dimensions: projections, dense FF, router; `dots_with_no_batch_dims_saveable`) and
  recomputes the rest (attention scores and probabilities, activations, normalisation,
  the MoE's grouped expert matmuls, which are kernels, not dots).

Under `model.scan_layers` (`models.layer_scan`), `none` recomputes elementwise and layout
results in the backward pass (`recompute_elementwise`). XLA does this by itself inside an
unrolled program, fusing a cheap producer into each consumer, but a value the backward pass
reads across a scan's loop boundary is stored, stacked over the layers: without the policy
the scanned dense WT-103 S step kept each layer's float32 LayerNorm intermediates (compiled
for an H100: 13.03 GiB against 8.47 with it and 10.46 unrolled, measured before the fused XL
attention recomputed its position scores). Under any policy JAX
recomputes a loop inside a block (the `blocked` expert matmuls) in the backward pass.

Gradients are those of `none` (the same computation, done twice).
"""

from collections.abc import Callable

import jax
from flax import nnx

# Elementwise arithmetic, conversions, layout and random-bit primitives: cheap to recompute
# from their inputs, and fused into their consumers when they are. Comparisons are not here,
# so dropout and ReLU masks are kept (one byte an element) rather than redrawn.
ELEMENTWISE = frozenset((
    "abs", "add", "and", "bitcast_convert_type", "broadcast_in_dim", "concatenate",
    "convert_element_type", "copy", "copy_p", "cos", "div", "erf", "exp", "exp2",
    "expand_dims", "integer_pow", "iota", "log", "log1p", "logistic", "max", "min", "mul",
    "neg", "or", "pad", "pow", "random_bits", "random_fold_in", "random_unwrap", "random_wrap",
    "reduce_max", "reshape", "reshard", "rsqrt", "select_n", "shift_right_logical", "sign",
    "sin", "slice", "sqrt", "square", "squeeze", "stop_gradient", "sub", "tanh", "transpose"))


def recompute_elementwise(prim, *_, **__) -> bool:
  """A `jax.checkpoint` policy: save every result but those of `ELEMENTWISE` primitives."""
  return prim.name not in ELEMENTWISE


POLICIES = {"block": jax.checkpoint_policies.nothing_saveable,
            "dots": jax.checkpoint_policies.dots_with_no_batch_dims_saveable}
REMAT_KINDS = ("none", *POLICIES)


def rematerialized(call: Callable, kind: str, *, scanned: bool = False) -> Callable:
  """`call(block, *args)` under `model.remat = kind` (module docstring); `none`: `call`,
  or, for a block run inside a scan (`scanned`), `call` under `recompute_elementwise`."""
  if kind == "none":
    return nnx.remat(call, policy=recompute_elementwise) if scanned else call
  return nnx.remat(call, policy=POLICIES[kind])
