"""Megatron's sequence parallelism (Korthikanti et al. 2022, Sec. 4.2.2): the edges of a
tensor-parallel region as explicit collectives.

Under sequence parallelism (`model.sequence_parallel` with `mesh.tensor` > 1) the residual
stream between the tensor-parallel regions is split along the sequence over `tensor`
(`parallel.sequence_shards`): LayerNorm, dropout and the residual add run on each device's
`T / t` positions. A region begins with column-parallel projections (`column_parallel`): their
inputs are all-gathered along T (Megatron's `g`; its transpose reduce-scatters the input
gradient) and each device multiplies by its slice of the weights' output heads or hidden units.
It ends with a row-parallel projection (`row_parallel`): each device's partial sum over its
heads or hidden units is reduce-scattered along T (`g-bar`; its transpose all-gathers the output
gradient). Per layer, forward and backward each move two all-gathers and two reduce-scatters of
`B x T x d` where tensor parallelism alone all-reduces twice: the same bytes, and activations
between the regions stored once per tensor group instead of `t` times.

Both run their body inside `jax.shard_map` over the batch axes and `tensor`. Left to XLA's
partitioner, the same sharding constraints gave an all-reduce followed by a slice (XLA:CPU), and
sometimes an all-gathered weight instead of the activations (XLA:CPU and libtpu, at shapes
where the two are the same size). Weights enter as each device's `tensor` slice (what their
logical axes give, `parallel.partition_spec`; an `fsdp` split is gathered at the map's edge);
the weights' gradients are summed over the batch axes by the map's transpose.

`scope(on)` turns it on for the layers called within (the decoder block does, per
`model.sequence_parallel`); outside a scope, or on a mesh without `tensor`, both functions call
their body on the arrays as they are: the layers' one code path.
"""

import contextlib
import contextvars
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp

from sparse_jax import parallel

_ACTIVE = contextvars.ContextVar("sequence_parallel", default=False)

Axes = tuple[str | None, ...]
HEADS_AXES = ("batch", None, "heads", None)  # Per-head activations `[B, T, H, Dh]`.


@contextlib.contextmanager
def scope(on: bool):
  """Sequence parallelism for the layers traced within, if `on` (module docstring)."""
  token = _ACTIVE.set(on)
  try:
    yield
  finally:
    _ACTIVE.reset(token)


def active() -> bool:
  """Whether the layers being traced run sequence-parallel: inside `scope(True)`, on a mesh
  whose `tensor` axis is larger than 1."""
  mesh = jax.sharding.get_abstract_mesh()
  return _ACTIVE.get() and parallel.axis_size(mesh, parallel.TENSOR) > 1


def _spec(mesh, logical: Axes) -> jax.sharding.PartitionSpec:
  """What a device holds of an activation inside the map: its rows' split over the batch
  axes and its split over `tensor`."""
  return parallel.partition_spec(logical, mesh=mesh,
                                 only=parallel.mesh_axes("batch", mesh) + (parallel.TENSOR,))


def _weight_spec(mesh, logical: Axes) -> jax.sharding.PartitionSpec:
  """What a device holds of a weight inside the map: its `tensor` slice (fsdp's split is
  gathered at the map's edge)."""
  return parallel.partition_spec(logical, mesh=mesh, only=(parallel.TENSOR,))


def _shards(x_bt_: jax.Array) -> Axes:
  return ("batch", "length") + (None,) * (x_bt_.ndim - 2)


def column_parallel(body: Callable, xs_bt_: Sequence[jax.Array],
                    weights: Sequence[tuple[jax.Array, Axes]], out_axes: Sequence[Axes]):
  """`body(*xs, *weights)` with each `x [B, T, ...]` whole along T, on each device's slice of
  the weights (each given with its logical axes) when `active()`; `out_axes` names the
  logical axes of the body's outputs (a tuple of them), whose `heads` or `mlp` dimension
  then comes out split over `tensor`. Outside a sequence-parallel scope: `body` on the
  arrays."""
  arrays = [w for w, _ in weights]
  if not active():
    return body(*xs_bt_, *arrays)
  mesh = jax.sharding.get_abstract_mesh()

  def gathered(*args):
    xs = [jax.lax.all_gather(x, parallel.TENSOR, axis=1, tiled=True)
          for x in args[:len(xs_bt_)]]
    return body(*xs, *args[len(xs_bt_):])

  in_specs = tuple(_spec(mesh, _shards(x)) for x in xs_bt_) + tuple(
      _weight_spec(mesh, axes) for _, axes in weights)
  out_specs = tuple(_spec(mesh, axes) for axes in out_axes)
  return jax.shard_map(gathered, in_specs=in_specs, out_specs=out_specs)(*xs_bt_, *arrays)


def row_parallel(body: Callable, ys: Sequence[tuple[jax.Array, Axes]],
                 weights: Sequence[tuple[jax.Array, Axes]]) -> jax.Array:
  """`body(*ys, *weights) -> [B, T, d]`, a projection contracting the `tensor`-split heads
  or hidden units of `ys` (each given with its logical axes) with each device's slice of the
  weights, reduce-scattered along T into sequence shards (summed in float32) when `active()`;
  outside a sequence-parallel scope, `body` on the arrays."""
  arrays = [a for a, _ in ys] + [w for w, _ in weights]
  if not active():
    return body(*arrays)
  mesh = jax.sharding.get_abstract_mesh()

  def scattered(*args):
    partial_btd = body(*args)
    summed = jax.lax.psum_scatter(partial_btd.astype(jnp.float32), parallel.TENSOR,
                                  scatter_dimension=1, tiled=True)
    return summed.astype(partial_btd.dtype)

  in_specs = (tuple(_spec(mesh, axes) for _, axes in ys)
              + tuple(_weight_spec(mesh, axes) for _, axes in weights))
  out_spec = _spec(mesh, ("batch", "length", None))
  return jax.shard_map(scattered, in_specs=in_specs, out_specs=out_spec)(*arrays)
