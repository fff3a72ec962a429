"""Reversible residual stacks: two streams whose backward pass recomputes, not stores, the
activations (RevNet, Gomez et al. 2017; Reformer; Scaling Transformers Sec. 4.2).

A half-residual `f` adds its output to one stream, then the streams swap (Trax 1.4's
`ReversibleHalfResidual` followed by `ReversibleSwap`):

    (x1, x2) -> (x2, x1 + f(x2))        inverted by        x2 = y1,  x1 = y2 - f(y1).

So a stack of them needs only its final streams to run backwards: each step's input is
rebuilt from its output by recomputing `f`, and `jax.vjp` of `f` at the rebuilt input gives
the cotangents. Memory for activations no longer grows with depth (one half-residual's
internals at a time), at the cost of one more forward pass of every `f`.

Two things make the recomputation give the forward pass's function exactly (paper Sec. 4.2):
- randomness (dropout, Gumbel noise, hash rotations) is drawn from a key that the stack
  derives per half-residual, so the recomputation redraws the same numbers;
- discrete choices (the sparse FF's units, LSH buckets) are recorded in the forward pass and
  replayed: the rebuilt input differs from the original by rounding, and a choice recomputed
  from it may flip, which the paper found trains worse. Records are small integer arrays.

The half-residual contract, a pure function:

    y_btd, loss, record = f(params, x_btd, key, replay, *context)

`y` has `x`'s shape; `loss` is a float32 scalar added to the objective (an FF's regulariser;
its gradient flows); `record` is a pytree of integer arrays, the discrete choices made;
`replay` is None in the forward pass and the recorded pytree in the recomputation, which `f`
must then use instead of choosing; `key` is the only source of randomness; `context` are
arrays every half-residual reads but nobody differentiates (a padding mask).

`reversible_stack` (recomputing) and `sequential_stack` (plain autodiff, storing activations:
the reference, and a model's non-reversible option) compute the same function.
`pure_half_residual` turns an NNX module into such an `f` and its state.
"""

import dataclasses
import functools
import zlib
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

HalfResidual = Callable[..., tuple[jax.Array, jax.Array, Any]]


def _half_step(f: HalfResidual, params, x1_btd, x2_btd, key, replay, context):
  """`(x2, x1 + f(x2), loss, record)`: one half-residual and the swap."""
  y_btd, loss, record = f(params, x2_btd, key, replay, *context)
  return x2_btd, x1_btd + y_btd.astype(x1_btd.dtype), loss, record


def _check_record(record, i: int) -> None:
  """Records hold discrete choices; a float leaf would be a stored activation."""
  for leaf in jax.tree.leaves(record):
    if not (jnp.issubdtype(leaf.dtype, jnp.integer) or leaf.dtype == jnp.bool_):
      raise TypeError(f"half-residual {i} recorded a {leaf.dtype} array; a record holds the "
                      "integer choices to replay, not activations")


def _forward(fns, params_list, x1_btd, x2_btd, key, context):
  """`(y1, y2, summed loss, records)`: every half-residual choosing afresh (no replay)."""
  loss = jnp.zeros((), jnp.float32)
  records = []
  for i, (f, params) in enumerate(zip(fns, params_list, strict=True)):
    x1_btd, x2_btd, loss_i, record = _half_step(
        f, params, x1_btd, x2_btd, jax.random.fold_in(key, i), None, context)
    _check_record(record, i)
    loss = loss + loss_i
    records.append(record)
  return x1_btd, x2_btd, loss, tuple(records)


def _reverse_step(f: HalfResidual, params, y1_btd, y2_btd, g1_btd, g2_btd, g_loss, key,
                  record, context):
  """Undo one half-residual and swap, pulling the cotangents back through it.

  Returns `(x1, x2, g_x1, g_x2, g_params)`: `x2 = y1` exactly, `x1 = y2 - f(y1)` with `f`
  recomputed on its key and replaying its record; `g_x1 = g_y2` (the identity path),
  `g_x2 = g_y1 + J_f^T (g_y2, g_loss)`.
  """
  def residual(params, x_btd):
    y_btd, loss, _ = f(params, x_btd, key, record, *context)
    return y_btd, loss

  (y_btd, loss), pullback = jax.vjp(residual, params, y1_btd)
  g_params, g_x_btd = pullback((g2_btd.astype(y_btd.dtype), g_loss.astype(loss.dtype)))
  x1_btd = y2_btd - y_btd.astype(y2_btd.dtype)
  return x1_btd, y1_btd, g2_btd, g1_btd + g_x_btd.astype(g1_btd.dtype), g_params


def _zero_cotangent(x):
  """Zeros of `x`'s tangent type: float zeros, or float0 for integer, bool and key arrays."""
  if jnp.issubdtype(x.dtype, jnp.inexact):
    return jnp.zeros_like(x)
  return np.zeros(jnp.shape(x), jax.dtypes.float0)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _reversible(fns, params_list, x1_btd, x2_btd, key, context):
  y1_btd, y2_btd, loss, _ = _forward(fns, params_list, x1_btd, x2_btd, key, context)
  return y1_btd, y2_btd, loss


def _reversible_fwd(fns, params_list, x1_btd, x2_btd, key, context):
  """Saves the final streams, params, key, context and records: no activations."""
  y1_btd, y2_btd, loss, records = _forward(fns, params_list, x1_btd, x2_btd, key, context)
  return (y1_btd, y2_btd, loss), (params_list, y1_btd, y2_btd, key, context, records)


def _reversible_bwd(fns, saved, cotangents):
  """Walks the half-residuals backwards, rebuilding each one's input from its output."""
  params_list, y1_btd, y2_btd, key, context, records = saved
  g1_btd, g2_btd, g_loss = cotangents
  g_params_list = [None] * len(fns)
  for i in reversed(range(len(fns))):
    y1_btd, y2_btd, g1_btd, g2_btd, g_params_list[i] = _reverse_step(
        fns[i], params_list[i], y1_btd, y2_btd, g1_btd, g2_btd, g_loss,
        jax.random.fold_in(key, i), records[i], context)
  return (tuple(g_params_list), g1_btd, g2_btd, _zero_cotangent(key),
          jax.tree.map(_zero_cotangent, context))


_reversible.defvjp(_reversible_fwd, _reversible_bwd)


def _check_streams(x1_btd: jax.Array, x2_btd: jax.Array) -> None:
  if x1_btd.shape != x2_btd.shape or x1_btd.dtype != x2_btd.dtype:
    raise ValueError(f"the two streams must match: {x1_btd.shape} {x1_btd.dtype} vs "
                     f"{x2_btd.shape} {x2_btd.dtype}")


def reversible_stack(fns: Sequence[HalfResidual], params_list: Sequence[Any],
                     x1_btd: jax.Array, x2_btd: jax.Array, key: jax.Array, *context):
  """`(y1 [B, T, d], y2 [B, T, d], summed loss)` of the half-residuals `fns` in order.

  Each `f_i` maps `(x1, x2) -> (x2, x1 + f_i(x2))` with key `fold_in(key, i)` and its own
  `params_list[i]`; `context` (arrays, or None) is passed to every `f_i` and is not
  differentiated. Differentiable in `params_list`, `x1` and `x2`; the backward pass
  recomputes every `f_i` from the outputs instead of storing activations (module docstring).
  `fns` are static: hashable callables that stay the same between calls.
  """
  _check_streams(x1_btd, x2_btd)
  return _reversible(tuple(fns), tuple(params_list), x1_btd, x2_btd, key, context)


def sequential_stack(fns: Sequence[HalfResidual], params_list: Sequence[Any],
                     x1_btd: jax.Array, x2_btd: jax.Array, key: jax.Array, *context):
  """`reversible_stack`'s function by plain autodiff, which stores every activation.

  The reference for `reversible_stack`, and a model's non-reversible option.
  """
  _check_streams(x1_btd, x2_btd)
  y1_btd, y2_btd, loss, _ = _forward(tuple(fns), tuple(params_list), x1_btd, x2_btd, key,
                                     jax.lax.stop_gradient(context))
  return y1_btd, y2_btd, loss


def _stream_key(key: jax.Array, tag: str) -> jax.Array:
  """A key per RNG stream name, so that e.g. `dropout` and `routing` draw independently."""
  return jax.random.fold_in(key, zlib.crc32(tag.encode()) & 0x7FFFFFFF)


def reseed_streams(module: nnx.Module, key: jax.Array) -> None:
  """Reseeds every RNG stream in `module` (including `Rngs.fork()`ed ones and nnx.Dropout's)
  from `key`: afterwards the module's randomness is a function of `key` alone.

  `nnx.reseed` matches streams by name and gives successive streams of one name successive
  keys in graph order, which is fixed by the module's structure.
  """
  tags = sorted({node.key.tag for _, node in nnx.iter_graph(module)
                 if isinstance(node, nnx.RngStream)})
  nnx.reseed(module, **{tag: _stream_key(key, tag) for tag in tags})


@dataclasses.dataclass(frozen=True)
class ModuleHalfResidual:
  """The pure half-residual of an NNX module with the reversible call contract
  `y, loss, record = module(x, *context, replay=None)`.

  Called as `f(state, x, key, replay, *context)` on the module's `nnx.State`: a fresh copy of
  the module is merged from `state`, its RNG streams reseeded from `key`, then called. The
  module the state came from is never mutated (its streams do not advance). Hashable by its
  graph definition, so a stack's `fns` stay static under `jax.jit`.
  """

  graphdef: nnx.GraphDef

  def __call__(self, state: nnx.State, x_btd: jax.Array, key: jax.Array, replay, *context):
    module = nnx.merge(self.graphdef, state)
    reseed_streams(module, key)
    return module(x_btd, *context, replay=replay)


def pure_half_residual(module: nnx.Module) -> tuple[ModuleHalfResidual, nnx.State]:
  """`(f, state)` for `reversible_stack` / `sequential_stack`.

  `state` is the module's whole state: its `nnx.Param`s, through which gradients flow, and
  its RNG streams (whose values `f` replaces from its key). Call this inside the outer
  model's `__call__`, so that under `nnx.grad` the params are the traced ones and the
  sublayers' `nnx.Param`s receive gradients.
  """
  graphdef, state = nnx.split(module)
  return ModuleHalfResidual(graphdef), state
