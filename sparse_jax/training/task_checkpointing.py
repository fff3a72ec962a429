"""Orbax checkpoints of a fine-tuning run: the trainable part only, over a frozen backbone.

Each step directory under `WORKDIR/checkpoints` holds `trainable` (the parameters the method
trains: plug-ins, head, optionally LayerNorms; everything for full fine-tuning), `opt_state`,
`data` (the grain iterator) and `config` (JSON). The frozen backbone is never copied: a task
costs the size of `trainable` on disk (SPARTAN App. E), and restoring rebuilds the backbone
from `config.backbone` and puts the trainable part on top.
"""

import os

import grain
import ml_collections
import orbax.checkpoint as ocp
from flax import nnx

from sparse_jax.training.checkpointing import abstract_state, checkpoint_dir

TRAINABLE_ITEM = "trainable"


class TaskCheckpointer:
  """Saves and restores fine-tuning runs; never deletes the last good checkpoint."""

  def __init__(self, workdir: str, *, max_to_keep: int = 2):
    options = ocp.CheckpointManagerOptions(max_to_keep=max_to_keep, create=True)
    self._manager = ocp.CheckpointManager(checkpoint_dir(workdir), options=options)

  def all_steps(self) -> list[int]:
    return list(self._manager.all_steps())

  def latest_step(self) -> int | None:
    return self._manager.latest_step()

  def save(self, step: int, *, model: nnx.Module, trainable, optimizer: nnx.Optimizer,
           data_iterator: grain.DatasetIterator, config: ml_collections.ConfigDict) -> None:
    """Saves asynchronously; call `wait()` before relying on the files."""
    if step in self._manager.all_steps():
      return
    self._manager.save(step, args=ocp.args.Composite(**{
        TRAINABLE_ITEM: ocp.args.StandardSave(nnx.state(model, trainable)),
        "opt_state": ocp.args.StandardSave(nnx.state(optimizer)),
        "data": grain.checkpoint.CheckpointSave(data_iterator),
        "config": ocp.args.JsonSave(config.to_dict()),
    }))

  def restore(self, step: int, *, model: nnx.Module, trainable, optimizer: nnx.Optimizer,
              data_iterator: grain.DatasetIterator) -> None:
    """Restores the trainable parameters, optimiser and iterator in place."""
    restored = self._manager.restore(step, args=ocp.args.Composite(**{
        TRAINABLE_ITEM: ocp.args.StandardRestore(abstract_state(nnx.state(model, trainable))),
        "opt_state": ocp.args.StandardRestore(abstract_state(nnx.state(optimizer))),
        "data": grain.checkpoint.CheckpointRestore(data_iterator),
    }))
    nnx.update(model, restored.trainable)
    nnx.update(optimizer, restored.opt_state)

  def restore_trainable(self, step: int, model: nnx.Module, trainable) -> None:
    """Puts a task's trainable parameters onto `model` (its backbone already loaded)."""
    restored = self._manager.restore(step, args=ocp.args.Composite(**{
        TRAINABLE_ITEM: ocp.args.StandardRestore(abstract_state(nnx.state(model, trainable)))}))
    nnx.update(model, restored.trainable)

  def restore_config(self, step: int) -> ml_collections.ConfigDict:
    restored = self._manager.restore(step, args=ocp.args.Composite(
        config=ocp.args.JsonRestore()))
    return ml_collections.ConfigDict(restored.config)

  def trainable_bytes(self, step: int) -> int:
    """Bytes on disk of step `step`'s trainable part: the storage one task adds."""
    root = os.path.join(str(self._manager.directory), str(step), TRAINABLE_ITEM)
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(root)
               for f in files)

  def wait(self) -> None:
    self._manager.wait_until_finished()

  def close(self) -> None:
    self._manager.close()
