"""Meshes and the one place that maps arrays to mesh axes.

The mesh has four axes, all `AxisType.Auto` so XLA propagates shardings through the model:

- `data`: data parallelism. The batch is split over it; parameters are replicated.
- `fsdp`: fully-sharded data parallelism. The batch is split over it too, and every parameter
  and optimiser-state array is split over it along one dimension that the fsdp size divides,
  if any (all-gathered by XLA where it is used).
- `expert`: expert parallelism. The batch is split over it too, and the MoE expert weights
  are split over it along their `experts` dimension; token slots travel to their expert's
  device and back (`sparse_jax.layers.expert_parallel`).
- `tensor`: tensor (model) parallelism, Megatron-style (Shoeybi et al. 2019). The batch is
  NOT split over it: its devices hold the same rows and split each layer's weights within
  the layer: attention heads (Q, K, V, the XL position projection and biases by head, the
  output projection by its input rows), feed-forward hidden units (the dense FF's `d_ff`,
  each expert's `G` columns; routers replicated), and the vocabulary of the embedding and
  the output layer. The column-parallel projections run on each device's slice and the
  row-parallel ones' partial products are summed over `tensor` (all-reduces of the
  activations, not gathers of weights: `benchmarks/tensor_parallel_collectives.py` counts
  them), at the edges the decoder's layers make explicit (`layers.sequence_parallel`) or
  where XLA's partitioner puts them. With sequence parallelism the activations between
  those regions are split along the sequence over `tensor` too (`length`). Which layers
  may be split is checked with the config (`sparse_jax.models.tensor_support`).

So every device holds `batch / (data * fsdp * expert)` rows of each batch (`BATCH_AXES`).
The trainer always runs on a mesh (1 x 1 x 1 x 1 on one device); layers and models used
without `jax.set_mesh`, as in a notebook, behave as they always did on one device.

Every parameter declares, where it is created, the logical name of each of its dimensions as
the variable metadata `logical_axes` (`nnx.Param(w, logical_axes=("embed", "mlp"))`; flax
modules through `kernel_metadata={"logical_axes": ...}` and the like). This module alone maps
those names to mesh axes; nothing depends on a parameter's attribute name. The metadata key is
our own, not flax's `out_sharding`, which would make flax shard eagerly and fail outside a
mesh. Adam's moments inside `nnx.Optimizer` carry the metadata of the parameter they mirror.

The logical axes (`LOGICAL_AXES`):

- `batch`: the examples of a batch (activations, the XL memory, expert-parallel tokens).
- `length`: the positions of a sequence in the residual stream and the XL memory, split over
  `tensor` between the tensor-parallel regions where the model asks for it (sequence
  parallelism, `model.sequence_parallel`; no parameter has this axis).
- `experts`: the expert dimension of MoE expert weights; each expert lives on one device of
  `expert`.
- `expert_scores`: a router's per-expert score dimension (its selector's rows). Not split
  over `expert`: every device scores its own tokens against all experts.
- `embed`: the model width `d_model`.
- `mlp`: hidden units of a feed-forward: `d_ff`, an expert's `G`, PKM's value rows, the
  classification head's hidden layer.
- `lowrank`: the rank of the sparse feed-forward's controller; an adapter's bottleneck
  (replicated over `tensor`).
- `vocab`: rows of an embedding table (tokens, positions, token types) and output logits.
- `heads`: attention heads (the sparse QKV layer's modules; SwitchHead's expert rows
  `h * E + e`); in a projection that keeps heads and their channels in one flattened
  dimension (`nnx.Linear`), that dimension.
- `head_dim`: the channels of one head (one module of the sparse QKV layer).
- `memory`: cells of a learned memory: PKM sub-keys, SPARTAN parents and children.
- `classes`, `conv`, `key_half`, `vocab_module`: a classifier's outputs, a convolution's
  filter taps, the two halves of a PKM product key, the tokens within one module of the
  multiplicative output layer (its `E` columns, which every module's product reads). Small;
  never split.

`RULES` maps them to mesh axes. Rules are tried in order, each on the first dimension with
its name whose size the product of its mesh axes (and of those an earlier rule put on that
dimension) divides, provided none of those axes already splits a dimension of the array.
So the expert weights are split over `expert` along `experts`; `heads`, `mlp` and `vocab`
over `tensor` (before any fsdp rule, so that fsdp then takes `embed`); every parameter over
`fsdp` along the first of `embed, mlp, vocab, ...` that the fsdp size divides (a dimension
`tensor` splits is split further, `("tensor", "fsdp")`; replicated if none divides); and
batches over `BATCH_AXES`. Arrays without declared axes (RNG keys, step counts, a parameter
that declares none) are replicated.
"""

import math
from collections.abc import Sequence

import jax
import numpy as np
from absl import logging
from flax import nnx
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

from sparse_jax import schema, validation

DATA, FSDP, EXPERT, TENSOR = "data", "fsdp", "expert", "tensor"
MESH_AXES = (DATA, FSDP, EXPERT, TENSOR)
BATCH_AXES = (DATA, FSDP, EXPERT)  # Not `tensor`: its devices hold the same batch rows.

LOGICAL_AXES_KEY = "logical_axes"  # The variable metadata holding a parameter's axes.
LOGICAL_AXES = ("batch", "length", "experts", "expert_scores", "embed", "mlp", "lowrank",
                "vocab", "vocab_module", "heads", "head_dim", "memory", "classes", "conv",
                "key_half")

RULES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("batch", BATCH_AXES),
    ("length", (TENSOR,)),
    ("experts", (EXPERT,)),
    ("heads", (TENSOR,)),
    ("mlp", (TENSOR,)),
    ("vocab", (TENSOR,)),
    ("embed", (FSDP,)),
    ("mlp", (FSDP,)),
    ("vocab", (FSDP,)),
    ("memory", (FSDP,)),
    ("heads", (FSDP,)),
    ("head_dim", (FSDP,)),
    ("lowrank", (FSDP,)),
    ("expert_scores", (FSDP,)),
)


class MeshConfig(schema.Schema):
  """The `mesh` section: sizes of the `(data, fsdp, expert, tensor)` axes (an empty section:
  one device). One of data, fsdp, expert may be -1, "all remaining devices"; `tensor` is a
  choice of the model's split, so it is always given (default 1: unsplit)."""

  data: int = 1  # Devices splitting the batch, the parameters replicated.
  fsdp: int = 1  # Devices splitting the batch and every parameter and optimiser state.
  expert: int = 1  # Devices splitting the batch and the MoE experts (docs/scaling_out.md).
  tensor: schema.PositiveInt = 1  # Devices splitting heads, FF widths and the vocabulary.

  def sizes(self) -> list[int]:
    return [self.data, self.fsdp, self.expert, self.tensor]

  def check(self, path: str) -> None:
    for axis, size in zip(BATCH_AXES, self.sizes()):
      validation.require(size >= 1 or size == -1, f"{path}.{axis}",
                         "a positive integer or -1 (all remaining devices)", size)
    validation.require(self.sizes().count(-1) <= 1, path,
                       "at most one of data, fsdp, expert set to -1", self.to_dict())

  def require_unsplit_model(self, what: str) -> None:
    """Raises `ConfigError` naming `mesh.tensor` unless it is 1: for models that are not
    split over `tensor` yet (`what` names them)."""
    validation.require(self.tensor == 1, "mesh.tensor",
                       f"1 with {what} (only the decoder LM and the RoBERTa encoder are split "
                       "over tensor so far)",
                       self.tensor)


def mesh_shape(mesh_config, n_devices: int) -> tuple[int, int, int, int]:
  """`(data, fsdp, expert, tensor)` sizes from a `mesh` section (`MeshConfig` or a mapping),
  -1 resolved to the remaining devices.

  Raises `ConfigError` naming the field for a bad size or a mesh larger than the `n_devices`
  available.
  """
  sizes = MeshConfig.parse(mesh_config, "mesh").sizes()
  if -1 in sizes:
    sizes[sizes.index(-1)] = max(1, n_devices // math.prod(s for s in sizes if s != -1))
  if math.prod(sizes) > n_devices:
    raise validation.ConfigError(
        f"mesh.data * mesh.fsdp * mesh.expert * mesh.tensor = {math.prod(sizes)} "
        f"({dict(zip(MESH_AXES, sizes))}) exceeds the {n_devices} devices available.")
  return tuple(sizes)


def make_mesh(shape: Sequence[int], devices: Sequence[jax.Device] | None = None) -> Mesh:
  """A `(data, fsdp, expert, tensor)` mesh of Auto axes over the first `prod(shape)` of
  `devices` (default: all devices). `shape` gives the sizes of the leading axes; those it
  leaves out are 1 (`(2, 1, 4)`: data 2, expert 4, tensor 1). `tensor` is the last axis,
  so a tensor group is neighbouring devices (one host's, on a multi-host mesh)."""
  shape = tuple(shape) + (1,) * (len(MESH_AXES) - len(shape))
  devices = list(jax.devices() if devices is None else devices)[:math.prod(shape)]
  return jax.make_mesh(shape, MESH_AXES, axis_types=(AxisType.Auto,) * len(MESH_AXES),
                       devices=devices)


def mesh_from_config(mesh_config) -> Mesh:
  """The mesh of a `mesh` section (`MeshConfig` or a mapping; empty: one device)."""
  shape = mesh_shape(mesh_config, jax.device_count())
  if math.prod(shape) < jax.device_count():
    logging.warning("The mesh %s uses %d of the %d devices.", dict(zip(MESH_AXES, shape)),
                    math.prod(shape), jax.device_count())
  return make_mesh(shape)


def axis_size(mesh, axis: str) -> int:
  """The size of `axis` in `mesh` (an abstract or concrete mesh), 1 if absent or no mesh."""
  if mesh is None or mesh.empty or axis not in mesh.axis_names:
    return 1
  return dict(mesh.shape)[axis]


def batch_shards(mesh) -> int:
  """How many ways a batch is split: `data * fsdp * expert`."""
  return math.prod(axis_size(mesh, axis) for axis in BATCH_AXES)


def mesh_axes(logical_name: str, mesh=None) -> tuple[str, ...]:
  """The mesh axes the `RULES` of `logical_name` map it to, in rule order (only those of
  `mesh`, when given)."""
  axes = [a for name, rule in RULES if name == logical_name for a in rule]
  return tuple(a for a in axes if mesh is None or a in mesh.axis_names)


def partition_spec(logical: Sequence[str | None], shape: Sequence[int] | None = None,
                   mesh=None, only: Sequence[str] | None = None) -> PartitionSpec:
  """`RULES` applied to the logical axes of an array (`None`: a dimension never split).

  With `mesh`, only its axes are used, and with `shape` too a rule skips a dimension that
  the product of its axes' sizes does not divide (see the module docstring). With `only`,
  only those mesh axes (what a `shard_map` body holds, the others gathered at its edge).
  """
  unknown = [name for name in logical if name is not None and name not in LOGICAL_AXES]
  if unknown:
    raise ValueError(f"unknown logical axes {unknown}; the known ones are {LOGICAL_AXES}.")
  split: list[tuple[str, ...]] = [()] * len(logical)  # The mesh axes of each dimension.
  for name, rule in RULES:
    axes = tuple(a for a in rule if (mesh is None or a in mesh.axis_names)
                 and (only is None or a in only))
    if not axes or any(set(axes) & set(done) for done in split):
      continue
    dims = [i for i, n in enumerate(logical) if n == name and (
        shape is None or shape[i] % math.prod(axis_size(mesh, a) for a in split[i] + axes) == 0)]
    if dims:
      split[dims[0]] += axes
  return PartitionSpec(*(None if not axes else axes[0] if len(axes) == 1 else axes
                         for axes in split))


def constrain(x: jax.Array, logical: Sequence[str | None]) -> jax.Array:
  """`x` constrained to the sharding `RULES` give its logical axes on the current mesh
  (`jax.set_mesh`; a dimension the mesh does not divide stays whole); `x` itself without a
  mesh. For activations whose sharding XLA would otherwise choose badly (the sparse QKV
  attention's output: gathered once, not carried split along `d_model` into the next
  LayerNorm and gathered at every matmul that reads it) and for decode caches (split by
  head). The spec is written as XLA writes a jitted function's outputs' (no mesh axes of
  size 1, no trailing unsplit dimensions): a cache fed back into the step that returned it
  then has the spec the step was compiled for, and does not compile it again."""
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty:
    return x
  spec = partition_spec(logical, x.shape, mesh)
  split = [tuple(a for a in ((axes,) if isinstance(axes, str) else axes or ())
                 if axis_size(mesh, a) > 1) for axes in spec]
  while split and not split[-1]:
    split.pop()
  spec = PartitionSpec(*(None if not axes else axes[0] if len(axes) == 1 else axes
                         for axes in split))
  return jax.lax.with_sharding_constraint(x, spec)


def sequence_shard_axes(ndim: int = 3) -> tuple[str | None, ...]:
  """The logical axes of `[B, T, ...]` on sequence shards: rows over the batch axes,
  positions over `tensor` (`length`)."""
  return ("batch", "length") + (None,) * (ndim - 2)


def whole_sequence_axes(ndim: int = 3) -> tuple[str | None, ...]:
  """The logical axes of `[B, T, ...]` whole along T: rows over the batch axes only."""
  return ("batch",) + (None,) * (ndim - 1)


def sequence_shards(x_bt_: jax.Array) -> jax.Array:
  """`x [B, T, ...]` split along T over `tensor` (and its rows over the batch axes): the
  residual stream between the tensor-parallel regions under sequence parallelism (Korthikanti
  et al. 2022), where LayerNorm, dropout and the residual add run on each device's positions.
  A row-parallel output constrained so is reduce-scattered instead of all-reduced."""
  return constrain(x_bt_, sequence_shard_axes(x_bt_.ndim))


def whole_sequences(x_bt_: jax.Array) -> jax.Array:
  """`x [B, T, ...]` whole along T on every device of `tensor` (its rows over the batch
  axes): the all-gather at the entry of a tensor-parallel region under sequence parallelism
  (its transpose reduce-scatters the input gradient)."""
  return constrain(x_bt_, whole_sequence_axes(x_bt_.ndim))


def declared_axes(variable: nnx.Variable) -> tuple[str, ...] | None:
  """The logical axes `variable` declares in its metadata, or None."""
  return variable.get_metadata(LOGICAL_AXES_KEY, None)


def _in_optimizer_state(path) -> bool:
  return any(getattr(key, "key", None) == "opt_state" for key in path)


def state_shardings(state, mesh: Mesh):
  """A `NamedSharding` for every array of an `nnx.State` (model and/or optimiser), in the
  state's structure: each Variable's from its declared logical axes, replicated without.

  Optimiser moments carry their parameter's metadata; those of another rank (Adafactor's
  factored row and column statistics, `(1,)` placeholders) are small and replicated.
  Raises ValueError for any other Variable that declares a different number of axes than it
  has.
  """

  def sharding(path, leaf):
    axes = declared_axes(leaf) if isinstance(leaf, nnx.Variable) else None
    if axes is not None and len(axes) != len(leaf.shape) and _in_optimizer_state(path):
      axes = None
    if axes is None:
      spec = PartitionSpec()
    elif len(axes) != len(leaf.shape):
      raise ValueError(f"{jax.tree_util.keystr(path)} declares logical axes {axes} for an "
                       f"array of shape {leaf.shape}.")
    else:
      spec = partition_spec(axes, leaf.shape, mesh)
    named = NamedSharding(mesh, spec)
    return leaf.replace(named) if isinstance(leaf, nnx.Variable) else named

  return jax.tree.map_with_path(sharding, state,
                                is_leaf=lambda x: isinstance(x, nnx.Variable))


def batch_sharding(mesh: Mesh, ndim: int = 2, batch_dim: int = 0) -> NamedSharding:
  """Arrays whose dimension `batch_dim` is the batch: split over `data`, `fsdp`, `expert`
  (replicated over `tensor`)."""
  logical: list[str | None] = [None] * ndim
  logical[batch_dim] = "batch"
  return NamedSharding(mesh, partition_spec(logical, mesh=mesh))


def replicated(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, PartitionSpec())


def local_rows(sharding: NamedSharding, global_shape: Sequence[int]) -> slice:
  """The contiguous rows of dimension 0 that this process's devices hold."""
  index_map = sharding.addressable_devices_indices_map(tuple(global_shape))
  starts = sorted({(idx[0].start or 0, idx[0].stop or global_shape[0])
                   for idx in index_map.values()})
  for (_, stop), (start, _) in zip(starts, starts[1:]):
    if stop != start:
      raise ValueError(f"this process's batch rows are not contiguous: {starts}.")
  return slice(starts[0][0], starts[-1][1])


def global_array(sharding: NamedSharding, local: np.ndarray, global_shape: Sequence[int]):
  """The global array whose rows `local_rows(sharding, global_shape)` this process holds."""
  return jax.make_array_from_process_local_data(sharding, local, tuple(global_shape))
