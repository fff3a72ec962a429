"""Rematerialisation (`model.remat`): trade compute for activation memory, per block.

- `none`: the backward pass reads every activation the forward pass stored;
- `block`: each block stores only its input; the backward pass recomputes the block
  (`jax.checkpoint_policies.nothing_saveable`): activation memory of one block plus the
  residual stream per layer, about one more forward pass of compute;
- `dots`: each block also keeps the outputs of its weight matmuls (dots without batch
  dimensions: projections, dense FF, router; `dots_with_no_batch_dims_saveable`) and
  recomputes the rest (attention scores and probabilities, activations, normalisation,
  the MoE's grouped expert matmuls, which are kernels, not dots).

Gradients are those of `none` (the same computation, done twice).
"""

from collections.abc import Callable

import jax
from flax import nnx

POLICIES = {"block": jax.checkpoint_policies.nothing_saveable,
            "dots": jax.checkpoint_policies.dots_with_no_batch_dims_saveable}
REMAT_KINDS = ("none", *POLICIES)


def rematerialized(call: Callable, kind: str) -> Callable:
  """`call(block, *args)` under `model.remat = kind` (module docstring); `none`: `call`."""
  if kind == "none":
    return call
  return nnx.remat(call, policy=POLICIES[kind])
