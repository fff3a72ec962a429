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
`B x T x d` where tensor parallelism alone all-reduces twice (XL attention gathers its memory's
shards too): the same bytes, and activations between the regions stored once per tensor group
instead of `t` times.

Both run their body inside `jax.shard_map` over the batch axes and `tensor`. Left to XLA's
partitioner, the same sharding constraints gave an all-reduce followed by a slice (XLA:CPU), and
sometimes an all-gathered weight instead of the activations (XLA:CPU and libtpu, at shapes
where the two are the same size). Weights enter as each device's `tensor` slice (what their
logical axes give, `parallel.partition_spec`; an `fsdp` split is gathered at the map's edge);
the weights' gradients are summed over the batch axes by the map's transpose.

Without sequence parallelism the same two functions are a tensor-parallel region's edges
(Megatron's `f` and `g`): the inputs enter whole and marked varying over `tensor`, so that the
transpose sums the input gradients of all of a region's projections in one all-reduce (XL
attention's Q and K/V read the same context: one all-reduce of its gradient, where the
partitioner all-reduced Q's and K/V's apart), and the row-parallel output is all-reduced.
The decoder block and the output layer trace their layers inside `scope(sequence)`
(`sequence`: `model.sequence_parallel`); outside a scope (the encoder, a layer called alone),
or on a mesh without `tensor`, both functions call their body on the arrays as they are: the
layers' one code path.
"""

import contextlib
import contextvars
from collections.abc import Callable, Sequence

import jax

from sparse_jax import parallel

# Inside a `scope`: whether the sequence is split (True) or only the weights (False).
_SEQUENCE = contextvars.ContextVar("sequence_parallel", default=None)

Axes = tuple[str | None, ...]
HEADS_AXES = ("batch", None, "heads", None)  # Per-head activations `[B, T, H, Dh]`.


@contextlib.contextmanager
def scope(sequence: bool):
  """Explicit edges for the tensor-parallel regions of the layers traced within, split along
  the sequence between them if `sequence` (module docstring)."""
  token = _SEQUENCE.set(sequence)
  try:
    yield
  finally:
    _SEQUENCE.reset(token)


def _mode() -> str | None:
  """The edges' mode: "sequence" or "tensor" inside a scope on a mesh with `tensor` > 1,
  else None (no explicit edges)."""
  sequence = _SEQUENCE.get()
  mesh = jax.sharding.get_abstract_mesh()
  if sequence is None or parallel.axis_size(mesh, parallel.TENSOR) == 1:
    return None
  return "sequence" if sequence else "tensor"


def active() -> bool:
  """Whether the layers being traced run sequence-parallel: inside `scope(True)`, on a mesh
  whose `tensor` axis is larger than 1."""
  return _mode() == "sequence"


def _spec(mesh, logical: Axes) -> jax.sharding.PartitionSpec:
  """What a device holds of an activation inside the map: its rows' split over the batch
  axes and its split over `tensor`."""
  return parallel.partition_spec(logical, mesh=mesh,
                                 only=parallel.mesh_axes("batch", mesh) + (parallel.TENSOR,))


def _weight_spec(mesh, logical: Axes) -> jax.sharding.PartitionSpec:
  """What a device holds of a weight inside the map: its `tensor` slice (fsdp's split is
  gathered at the map's edge)."""
  return parallel.partition_spec(logical, mesh=mesh, only=(parallel.TENSOR,))


def column_parallel(body: Callable, xs_bt_: Sequence[jax.Array],
                    weights: Sequence[tuple[jax.Array, Axes]], out_axes: Sequence[Axes]):
  """`body(*xs, *weights)` with each `x [B, T, ...]` whole along T, on each device's slice of
  the weights (each given with its logical axes); `out_axes` names the logical axes of the
  body's outputs (a tuple of them), whose `heads` or `mlp` dimension comes out split over
  `tensor`. Under sequence parallelism the `xs` arrive on sequence shards and are gathered;
  otherwise whole, and marked varying over `tensor` so that the transpose sums the input
  gradients of all the body's projections over `tensor` in one all-reduce per input (left to
  the partitioner, one per projection). Outside a scope: `body` on the arrays."""
  arrays = [w for w, _ in weights]
  mode = _mode()
  if mode is None:
    return body(*xs_bt_, *arrays)
  mesh = jax.sharding.get_abstract_mesh()
  n = len(xs_bt_)

  def mapped(*args):
    if mode == "sequence":
      xs = [jax.lax.all_gather(x, parallel.TENSOR, axis=1, tiled=True) for x in args[:n]]
    else:
      xs = jax.lax.pcast(args[:n], parallel.TENSOR, to="varying")
    return body(*xs, *args[n:])

  x_axes = (parallel.sequence_shard_axes if mode == "sequence"
            else parallel.whole_sequence_axes)
  in_specs = tuple(_spec(mesh, x_axes(x.ndim)) for x in xs_bt_) + tuple(
      _weight_spec(mesh, axes) for _, axes in weights)
  out_specs = tuple(_spec(mesh, axes) for axes in out_axes)
  return jax.shard_map(mapped, in_specs=in_specs, out_specs=out_specs)(*xs_bt_, *arrays)


def row_parallel(body: Callable, ys: Sequence[tuple[jax.Array, Axes]],
                 weights: Sequence[tuple[jax.Array, Axes]]) -> jax.Array:
  """`body(*ys, *weights) -> [B, T, d]`, a projection contracting the `tensor`-split heads
  or hidden units of `ys` (each given with its logical axes) with each device's slice of the
  weights; the partial sums added over `tensor` in the body's dtype (the compute dtype, as
  the partitioner's all-reduce and Megatron's: bfloat16 training moves 2 bytes a value):
  reduce-scattered along T into sequence shards under sequence parallelism, else
  all-reduced. Outside a scope: `body` on the arrays."""
  arrays = [a for a, _ in ys] + [w for w, _ in weights]
  mode = _mode()
  if mode is None:
    return body(*arrays)
  mesh = jax.sharding.get_abstract_mesh()

  def mapped(*args):
    partial_btd = body(*args)
    if mode == "sequence":
      return jax.lax.psum_scatter(partial_btd, parallel.TENSOR, scatter_dimension=1,
                                  tiled=True)
    return jax.lax.psum(partial_btd, parallel.TENSOR)

  in_specs = (tuple(_spec(mesh, axes) for _, axes in ys)
              + tuple(_weight_spec(mesh, axes) for _, axes in weights))
  out_axes = (parallel.sequence_shard_axes() if mode == "sequence"
              else parallel.whole_sequence_axes())
  return jax.shard_map(mapped, in_specs=in_specs, out_specs=_spec(mesh, out_axes))(*arrays)
