"""Orbax checkpoints of a training run under `WORKDIR/checkpoints`.

Each step directory holds the model variables (`params`), the optimiser state (`opt_state`),
the XL memory, the grain iterator state (`data`) and the config as JSON, so a run resumes
exactly where it stopped and `eval.py` rebuilds the model from the checkpoint alone. RNG
state is not saved: the training step derives its randomness from (seed, step).
"""

import os

import grain
import jax
import ml_collections
import orbax.checkpoint as ocp
from flax import nnx

from sparse_jax.models.xl_memory import XLMemory

_NOT_RNG = nnx.Not(nnx.RngState)


def checkpoint_dir(workdir: str) -> str:
  return os.path.join(os.path.abspath(workdir), "checkpoints")


def abstract_state(tree):
  return jax.tree.map(ocp.utils.to_shape_dtype_struct, tree)


class Checkpointer:
  """Saves and restores training runs; never deletes the last good checkpoint."""

  def __init__(self, workdir: str, *, max_to_keep: int = 3):
    options = ocp.CheckpointManagerOptions(max_to_keep=max_to_keep, create=True)
    self._manager = ocp.CheckpointManager(checkpoint_dir(workdir), options=options)

  def latest_step(self) -> int | None:
    return self._manager.latest_step()

  def all_steps(self) -> list[int]:
    return list(self._manager.all_steps())

  def save(self, step: int, *, model: nnx.Module, optimizer: nnx.Optimizer, memory: XLMemory,
           data_iterator: grain.DatasetIterator, config: ml_collections.ConfigDict) -> None:
    """Saves asynchronously; call `wait()` before relying on the files."""
    if step in self._manager.all_steps():
      return
    self._manager.save(step, args=ocp.args.Composite(
        params=ocp.args.StandardSave(nnx.state(model, _NOT_RNG)),
        opt_state=ocp.args.StandardSave(nnx.state(optimizer)),
        memory=ocp.args.StandardSave({"hidden": memory.hidden_lbmd, "valid": memory.valid}),
        data=grain.checkpoint.CheckpointSave(data_iterator),
        config=ocp.args.JsonSave(config.to_dict()),
    ))

  def restore(self, step: int, *, model: nnx.Module, optimizer: nnx.Optimizer,
              memory: XLMemory, data_iterator: grain.DatasetIterator) -> XLMemory:
    """Restores model, optimiser and iterator in place; returns the saved memory."""
    memory_tree = {"hidden": memory.hidden_lbmd, "valid": memory.valid}
    restored = self._manager.restore(step, args=ocp.args.Composite(
        params=ocp.args.StandardRestore(abstract_state(nnx.state(model, _NOT_RNG))),
        opt_state=ocp.args.StandardRestore(abstract_state(nnx.state(optimizer))),
        memory=ocp.args.StandardRestore(abstract_state(memory_tree)),
        data=grain.checkpoint.CheckpointRestore(data_iterator),
    ))
    nnx.update(model, restored.params)
    nnx.update(optimizer, restored.opt_state)
    return XLMemory(restored.memory["hidden"], restored.memory["valid"])

  def restore_params(self, step: int, model: nnx.Module) -> None:
    """Restores only the model variables (for evaluation)."""
    restored = self._manager.restore(step, args=ocp.args.Composite(
        params=ocp.args.StandardRestore(abstract_state(nnx.state(model, _NOT_RNG)))))
    nnx.update(model, restored.params)

  def restore_config(self, step: int) -> ml_collections.ConfigDict:
    restored = self._manager.restore(step, args=ocp.args.Composite(
        config=ocp.args.JsonRestore()))
    return ml_collections.ConfigDict(restored.config)

  def wait(self) -> None:
    self._manager.wait_until_finished()

  def close(self) -> None:
    self._manager.close()
