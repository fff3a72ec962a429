"""Compile a task's training and evaluation steps for an accelerator this machine lacks.

`compile_task(task, target)` builds what training would (the same model, optimiser, step,
shardings and dtypes, from the same config) as shapes only, on the abstract devices of
`target` (`sparse_jax.aot.targets`) in the config's mesh, and compiles the training step and
the evaluation step with that device's compiler (XLA:GPU with Triton and ptxas, or libtpu).
No data is read and no array created, so it runs on a CPU machine in seconds to minutes.
What it tells: that everything compiles, and the memory each device needs (`aot.memory`).
What it cannot: speed, numerics, or memory a runtime adds outside XLA's buffers.
"""

import dataclasses
import math
import re

import jax
import jax.numpy as jnp
from flax import nnx

from sparse_jax import parallel
from sparse_jax.aot import matmul_dtypes, memory, targets
from sparse_jax.training import xla_fallbacks
from sparse_jax.training.placement import Placement
from sparse_jax.training.steps import make_train_step
from sparse_jax.training.task import Task


@dataclasses.dataclass(frozen=True)
class CompiledTask:
  """The compiled steps of a task for a target, and what they need of each device."""

  target: targets.Target
  mesh_shape: dict[str, int]
  train: jax.stages.Compiled
  eval: jax.stages.Compiled
  xla_options: dict  # XLA options the steps needed to compile (`xla_fallbacks`).
  matmul_operands: str  # The training step's matmul operand dtypes (`aot.matmul_dtypes`).
  train_use: memory.MemoryUse
  eval_use: memory.MemoryUse
  resident_bytes: int  # Training state and carry per device, alive while evaluating too.
  params_bytes: int  # The model's part of it, which evaluation reads in place.

  @property
  def eval_peak(self) -> int:
    """Evaluation runs between training steps: the training state stays resident and the
    evaluation step's arguments other than the parameters come on top."""
    return self.resident_bytes - self.params_bytes + self.eval_use.total

  @property
  def peak(self) -> int:
    return max(self.train_use.total, self.eval_peak)

  @property
  def fits(self) -> bool:
    return self.peak <= self.target.memory_bytes

  def report(self) -> list[str]:
    """The lines `train.py --compile_only` prints."""
    device = self.target.memory_bytes
    lines = [f"compiled for {self.target} ({self.target.description}, "
             f"{self.target.n_devices} device(s)), mesh {self.mesh_shape}; per device:",
             "  " + memory.format_use("training step", self.train_use),
             "  " + memory.format_use("evaluation step", self.eval_use),
             f"  matmul and convolution operands of the training step, by FLOPs: "
             f"{self.matmul_operands}",
             f"  evaluation with the training state resident: "
             f"{self.eval_peak / memory.GIB:.3f} GiB",
             f"  peak {self.peak / memory.GIB:.3f} GiB of the device's "
             f"{device / memory.GIB:.2f} GiB: {memory.verdict(self.peak, device)}"]
    if self.xla_options:
      lines.append(f"  compiled with XLA options {self.xla_options} (see "
                   "sparse_jax.training.xla_fallbacks)")
    pool = int(device * memory.JAX_GPU_POOL_FRACTION)
    if self.target.platform == "gpu" and pool < self.peak <= device:
      lines.append(f"  note: above the {memory.JAX_GPU_POOL_FRACTION:.0%} of device memory "
                   f"that JAX's GPU allocator takes by default ({pool / memory.GIB:.2f} GiB); "
                   "run with XLA_PYTHON_CLIENT_MEM_FRACTION=0.95")
    return lines


def _bytes_per_device(shapes) -> int:
  """Bytes one device holds of placed ShapeDtypeStructs (its shard of each)."""
  return sum(math.prod(x.sharding.shard_shape(x.shape)) * _itemsize(x.dtype)
             for x in jax.tree.leaves(shapes))


def _itemsize(dtype) -> int:
  if jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key):  # Typed keys: their raw key data.
    data = jax.eval_shape(jax.random.key_data, jax.ShapeDtypeStruct((), dtype))
    return math.prod(data.shape) * data.dtype.itemsize
  return jnp.dtype(dtype).itemsize


class DoesNotFitError(RuntimeError):
  """The TPU compiler refused a step larger than the device's memory (libtpu checks at
  compile time, so no executable, and no breakdown of its memory, exists)."""


# libtpu's message ("Ran out of memory on HBM", older "in memory space hbm"); running out of
# VMEM or SMEM instead is a kernel that does not compile, reported as such.
_TPU_OUT_OF_HBM = re.compile(r"out of memory (on|in memory space) hbm", re.IGNORECASE)


def lower_for(traced: jax.stages.Traced, target: targets.Target) -> jax.stages.Lowered:
  return traced.lower(lowering_platforms=(target.lowering_platform,))


def compile_for(lowered: jax.stages.Lowered, target: targets.Target
                ) -> tuple[jax.stages.Compiled, dict]:
  """`lowered` compiled for `target`, with the XLA options it needed
  (`training.xla_fallbacks`); raises `DoesNotFitError` when libtpu finds it too large."""
  try:
    return xla_fallbacks.compile_lowered(lowered, target.platform)
  except jax.errors.JaxRuntimeError as e:
    if target.platform == "tpu" and _TPU_OUT_OF_HBM.search(str(e)):
      raise DoesNotFitError(f"does not fit on {target} ({target.description}): "
                            f"{str(e).splitlines()[0]}") from e
    raise


def target_mesh(task: Task, target: targets.Target):
  """The config's mesh over `target`'s devices (-1: all of them)."""
  devices = targets.target_devices(target)
  return parallel.make_mesh(parallel.mesh_shape(task.typed.mesh, len(devices)), devices)


def trace_train_step(task: Task, placement: Placement):
  """The task's training step traced on shapes placed on `placement`'s mesh (call under
  `jax.set_mesh`), as training would build it; returns `(traced, graphdef, state, carry)`.
  Nothing is allocated."""
  model, optimizer = nnx.eval_shape(task.init_model_and_optimizer)
  graphdef, state = nnx.split((model, optimizer))
  shardings = nnx.to_pure_dict(placement.state_shardings(state))
  state = placement.placed_shapes(nnx.to_pure_dict(state), shardings)
  carry = jax.eval_shape(lambda: task.init_carry(model, placement))
  carry = placement.placed_shapes(carry, task.carry_shardings(placement))
  batch = placement.batch_shapes(task.batch_shapes())
  replicated = parallel.replicated(placement.mesh)
  train_step = make_train_step(graphdef, task.loss, seed=task.typed.seed,
                               rng_impl=task.typed.train.rng_impl, wrt=task.trainable,
                               out_shardings=(shardings,
                                              task.carry_shardings(placement), replicated),
                               accum_steps=task.typed.train.grad_accum_steps, carry_rows=task)
  step_index = jax.ShapeDtypeStruct((), jnp.int32, sharding=replicated)
  return train_step.trace(state, carry, batch, step_index), graphdef, state, carry


def compile_task(task: Task, target: targets.Target) -> CompiledTask:
  """Compiles `task`'s training and evaluation steps for `target` (module docstring).
  Raises `targets.TargetError` when the target's compiler is not installed, `ConfigError`
  when the config's mesh does not fit the target, `DoesNotFitError` when the TPU compiler
  refuses a step too large for the device, and the compiler's error when a step does not
  compile."""
  mesh = target_mesh(task, target)
  placement = Placement(mesh)
  task.check_mesh(placement)
  task.check_accumulation(placement)
  with jax.set_mesh(mesh):
    traced, graphdef, state, carry = trace_train_step(task, placement)
    lowered = lower_for(traced, target)
    operands = matmul_dtypes.describe(matmul_dtypes.contractions(lowered.as_text()))
    train, options = compile_for(lowered, target)
    model = nnx.merge(graphdef, state)[0]
    eval_fn, eval_args = task.eval_step(model, placement)
    params = nnx.state(model)
    evaluation, eval_options = compile_for(lower_for(eval_fn.trace(params, *eval_args), target),
                                           target)
  return CompiledTask(
      target=target, mesh_shape=dict(mesh.shape), train=train, eval=evaluation,
      xla_options={**options, **eval_options}, matmul_operands=operands,
      train_use=memory.MemoryUse.of(train), eval_use=memory.MemoryUse.of(evaluation),
      resident_bytes=_bytes_per_device((state, carry)), params_bytes=_bytes_per_device(params))
