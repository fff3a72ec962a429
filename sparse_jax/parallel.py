"""Meshes and the one place that maps arrays to mesh axes.

The mesh has three axes, all `AxisType.Auto` so XLA propagates shardings through the model:

- `data`: data parallelism. The batch is split over it; parameters are replicated.
- `fsdp`: fully-sharded data parallelism. The batch is split over it too, and every parameter
  and optimiser-state array is split over it along one dimension (all-gathered by XLA where
  it is used).
- `expert`: expert parallelism. The batch is split over it too, and the MoE experts
  (`w_up`, `w_down`) are split over it along their expert dimension; token slots travel to
  their expert's device and back (`sparse_jax.layers.expert_parallel`).

So every device holds `batch / (data * fsdp * expert)` rows of each batch. The trainer always
runs on a mesh (1 x 1 x 1 on one device); layers and models used without `jax.set_mesh`, as
in a notebook, behave as they always did on one device.

Logical axes name what a parameter dimension is; `RULES` maps them to mesh axes:
`experts` (a MoE's expert dimension) -> `expert`; `fsdp` (the dimension chosen for FSDP) ->
`fsdp`; `batch` -> all three axes.
"""

import math
from collections.abc import Sequence

import jax
import numpy as np
from absl import logging
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

from sparse_jax import validation

DATA, FSDP, EXPERT = "data", "fsdp", "expert"
MESH_AXES = (DATA, FSDP, EXPERT)
BATCH_AXES = (DATA, FSDP, EXPERT)

RULES = {"batch": BATCH_AXES, "experts": EXPERT, "fsdp": FSDP}

# Parameters whose leading dimension is the expert dimension (`MoE.w_up`, `MoE.w_down`).
EXPERT_PARAMS = ("w_up", "w_down")


def mesh_shape(mesh_config, n_devices: int) -> tuple[int, int, int]:
  """`(data, fsdp, expert)` sizes from a `config.mesh` section; one size may be -1 (the rest).

  Sizes default to 1. Raises `ConfigError` naming the field for a bad size or a mesh larger
  than the `n_devices` available.
  """
  sizes = [mesh_config.get(axis, 1) for axis in MESH_AXES]
  for axis, size in zip(MESH_AXES, sizes):
    if not isinstance(size, int) or (size < 1 and size != -1):
      raise validation.ConfigError(
          f"mesh.{axis} must be a positive integer or -1 (all remaining devices); got {size!r}.")
  if sizes.count(-1) > 1:
    raise validation.ConfigError("at most one of mesh.data, mesh.fsdp, mesh.expert may be -1.")
  if -1 in sizes:
    sizes[sizes.index(-1)] = max(1, n_devices // math.prod(s for s in sizes if s != -1))
  if math.prod(sizes) > n_devices:
    raise validation.ConfigError(
        f"mesh.data * mesh.fsdp * mesh.expert = {math.prod(sizes)} "
        f"({dict(zip(MESH_AXES, sizes))}) exceeds the {n_devices} devices available.")
  return tuple(sizes)


def make_mesh(shape: Sequence[int], devices: Sequence[jax.Device] | None = None) -> Mesh:
  """A `(data, fsdp, expert)` mesh of Auto axes over the first `prod(shape)` of `devices`
  (default: all devices)."""
  devices = list(jax.devices() if devices is None else devices)[:math.prod(shape)]
  return jax.make_mesh(tuple(shape), MESH_AXES, axis_types=(AxisType.Auto,) * 3,
                       devices=devices)


def mesh_from_config(mesh_config) -> Mesh:
  """The mesh of a `config.mesh` section (an empty section: one device)."""
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


def logical_axes(name: str, shape: Sequence[int], fsdp_size: int) -> tuple[str | None, ...]:
  """Logical axes of a parameter (or its optimiser state) called `name` of `shape`.

  A MoE expert weight's first dimension is `experts`. FSDP splits the largest remaining
  dimension that `fsdp_size` divides (the first such on ties); arrays with no such dimension
  (scalars, small vectors) stay replicated.
  """
  axes: list[str | None] = [None] * len(shape)
  if name in EXPERT_PARAMS and len(shape) == 3:
    axes[0] = "experts"
  if fsdp_size > 1:
    free = [i for i in range(len(shape)) if axes[i] is None and shape[i] % fsdp_size == 0]
    if free:
      axes[max(free, key=lambda i: (shape[i], -i))] = "fsdp"
  return tuple(axes)


def to_mesh_axes(logical: Sequence[str | None]) -> PartitionSpec:
  """Applies `RULES` to logical axes."""
  return PartitionSpec(*(None if name is None else RULES[name] for name in logical))


def _last_name(path) -> str:
  """The innermost string key of a state path: the parameter's attribute name (a path ends
  in the Variable's own `.value`, which is skipped)."""
  keys = [k.key for k in path if isinstance(k, jax.tree_util.DictKey)]
  return next((k for k in reversed(keys) if isinstance(k, str)), "")


def state_shardings(state, mesh: Mesh):
  """A `NamedSharding` for every array of an `nnx.State` (model and/or optimiser)."""
  fsdp_size = axis_size(mesh, FSDP)

  def sharding(path, leaf):
    shape = getattr(leaf, "shape", ())
    if jax.dtypes.issubdtype(getattr(leaf, "dtype", np.float32), jax.dtypes.prng_key):
      return NamedSharding(mesh, PartitionSpec())
    return NamedSharding(mesh, to_mesh_axes(logical_axes(_last_name(path), shape, fsdp_size)))

  return jax.tree.map_with_path(sharding, state)


def batch_sharding(mesh: Mesh, ndim: int = 2, batch_dim: int = 0) -> NamedSharding:
  """Arrays whose dimension `batch_dim` is the batch: split over `data`, `fsdp`, `expert`."""
  spec = [None] * ndim
  spec[batch_dim] = RULES["batch"]
  return NamedSharding(mesh, PartitionSpec(*spec))


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
