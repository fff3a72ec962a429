"""Where a training run's arrays live on its mesh: state, XL memory and batches.

The rules are `sparse_jax.parallel`'s; this module applies them. Everything is created
already sharded (a jitted constructor with `out_shardings`), so no device ever holds a whole
FSDP-sharded model, and every process builds only its own rows of each batch.
"""

from collections.abc import Callable

import grain
import jax
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding

from sparse_jax import parallel, validation
from sparse_jax.layers.registry import MoEConfig
from sparse_jax.models.xl_memory import XLMemory


def _global_array(value: jax.Array, sharding) -> jax.Array:
  """`value` (the same on every process) as an array of `sharding`; typed PRNG keys are
  placed through their raw key data."""
  if jax.dtypes.issubdtype(value.dtype, jax.dtypes.prng_key):
    data = _global_array(jax.random.key_data(value), sharding)
    return jax.random.wrap_key_data(data, impl=jax.random.key_impl(value))
  host = np.asarray(value)
  return jax.make_array_from_callback(host.shape, sharding, lambda index: host[index])


class Placement:
  """A mesh and the shardings of a run's arrays on it."""

  def __init__(self, mesh: Mesh):
    self.mesh = mesh
    self.shards = parallel.batch_shards(mesh)

  def check_batch(self, batch_size: int, field: str) -> None:
    validation.require(batch_size % self.shards == 0, field,
                       f"divisible by mesh.data * mesh.fsdp * mesh.expert = {self.shards} "
                       f"(mesh {dict(self.mesh.shape)})", batch_size)

  def check_experts(self, ff) -> None:
    """Raises `ConfigError` unless (with expert parallelism) the experts of the typed
    `model.ff` section split evenly over the mesh's `expert` axis."""
    n_ep = parallel.axis_size(self.mesh, parallel.EXPERT)
    if n_ep > 1:
      n_experts = ff.n_experts if isinstance(ff, MoEConfig) else None
      validation.require(n_experts is not None and n_experts % n_ep == 0, "model.ff.n_experts",
                         f"a MoE expert count divisible by mesh.expert = {n_ep}", n_experts)

  def create(self, build: Callable[[], nnx.Module | tuple]):
    """Runs `build()` (modules) with each array created directly in its sharding."""
    graphdef, abstract = nnx.split(nnx.eval_shape(build))
    shardings = parallel.state_shardings(abstract, self.mesh)
    state = jax.jit(lambda: nnx.split(build())[1], out_shardings=shardings)()
    return nnx.merge(graphdef, state)

  def put(self, modules):
    """Modules built eagerly (say, from pretrained weights) moved into their shardings.

    Every process built the same values, so each fills its own devices' shards from its copy
    (`jax.device_put` cannot target other processes' devices).
    """
    graphdef, state = nnx.split(modules)
    placed = jax.tree.map(_global_array, state, self.state_shardings(state))
    return nnx.merge(graphdef, placed)

  def state_shardings(self, state):
    return parallel.state_shardings(state, self.mesh)

  def memory_shardings(self, sequence_parallel: bool = False) -> XLMemory:
    """The XL memory `[L, B, M, d]`: its rows over the batch axes, and with
    `sequence_parallel` its positions over `tensor` (as the residual stream it is made of)."""
    logical = (None, "batch", "length" if sequence_parallel else None, None)
    return XLMemory(NamedSharding(self.mesh, parallel.partition_spec(logical, mesh=self.mesh)),
                    parallel.replicated(self.mesh))

  def create_memory(self, build: Callable[[], XLMemory],
                    sequence_parallel: bool = False) -> XLMemory:
    return jax.jit(build, out_shardings=self.memory_shardings(sequence_parallel))()

  def batch_shapes(self, shapes: dict[str, jax.ShapeDtypeStruct]
                   ) -> dict[str, jax.ShapeDtypeStruct]:
    """Global batch `shapes` in the shardings `global_batch` gives their arrays."""
    return {name: jax.ShapeDtypeStruct(
        value.shape, value.dtype, sharding=parallel.batch_sharding(self.mesh, len(value.shape)))
            for name, value in shapes.items()}

  @staticmethod
  def placed_shapes(shapes, shardings):
    """`shapes` (a pytree of arrays or ShapeDtypeStructs) as ShapeDtypeStructs in
    `shardings` (the same structure)."""
    return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                        shapes, shardings)

  def local_rows(self, batch_size: int) -> slice:
    """The rows of every `[batch_size, ...]` batch that this process's devices hold."""
    return parallel.local_rows(parallel.batch_sharding(self.mesh), (batch_size, 1))

  def data_shard(self, batch_size: int) -> grain.sharding.ShardOptions:
    """The block of streams this process reads: its devices' rows of a `[batch_size, S]`."""
    rows = self.local_rows(batch_size)
    per_process = rows.stop - rows.start
    return grain.sharding.ShardOptions(shard_index=rows.start // per_process,
                                       shard_count=batch_size // per_process)

  def global_batch(self, local: dict[str, np.ndarray], batch_size: int) -> dict[str, jax.Array]:
    """Assembles the global `[batch_size, ...]` arrays from this process's rows."""
    return {name: parallel.global_array(parallel.batch_sharding(self.mesh, value.ndim), value,
                                        (batch_size, *value.shape[1:]))
            for name, value in local.items()}
