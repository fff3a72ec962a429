"""Orbax checkpoints of a training run under `WORKDIR/checkpoints`, for every task.

Each step directory holds the model variables the task keeps (item `params` for a language
model: every variable but RNG state; item `trainable` for fine-tuning: only what trains, so a
task costs the size of its trainable part on disk, SPARTAN App. E), the optimiser state
(`opt_state`), the task's named extra items (a language model's XL memory), the grain
iterator state (`data`) and the config as JSON, so a run resumes exactly where it stopped and
`eval.py` rebuilds the model from the checkpoint alone. RNG state is not saved: the training
step derives its randomness from (seed, step).
"""

import dataclasses
import os

import grain
import jax
import ml_collections
import orbax.checkpoint as ocp
from flax import nnx

NOT_RNG = nnx.Not(nnx.RngState)


@dataclasses.dataclass(frozen=True)
class ParamsItem:
  """Which model variables a checkpoint holds, and the item they are stored under."""

  name: str = "params"
  filter: nnx.filterlib.Filter = NOT_RNG


def checkpoint_dir(workdir: str) -> str:
  return os.path.join(os.path.abspath(workdir), "checkpoints")


def abstract_state(tree):
  return jax.tree.map(ocp.utils.to_shape_dtype_struct, tree)


class Checkpointer:
  """Saves and restores training runs; never deletes the last good checkpoint."""

  def __init__(self, workdir: str, *, max_to_keep: int = 3, params: ParamsItem = ParamsItem()):
    options = ocp.CheckpointManagerOptions(max_to_keep=max_to_keep, create=True)
    self._manager = ocp.CheckpointManager(checkpoint_dir(workdir), options=options)
    self._params = params

  def latest_step(self) -> int | None:
    return self._manager.latest_step()

  def all_steps(self) -> list[int]:
    return list(self._manager.all_steps())

  def save(self, step: int, *, model: nnx.Module, optimizer: nnx.Optimizer,
           data_iterator: grain.DatasetIterator, config: ml_collections.ConfigDict,
           extras: dict | None = None) -> None:
    """Saves asynchronously (`extras`: item name -> pytree of arrays); call `wait()` before
    relying on the files."""
    if step in self._manager.all_steps():
      return
    self._manager.save(step, args=ocp.args.Composite(**{
        self._params.name: ocp.args.StandardSave(nnx.state(model, self._params.filter)),
        "opt_state": ocp.args.StandardSave(nnx.state(optimizer)),
        **{name: ocp.args.StandardSave(tree) for name, tree in (extras or {}).items()},
        "data": grain.checkpoint.CheckpointSave(data_iterator),
        "config": ocp.args.JsonSave(config.to_dict()),
    }))

  def restore(self, step: int, *, model: nnx.Module, optimizer: nnx.Optimizer,
              data_iterator: grain.DatasetIterator, extras: dict | None = None) -> dict:
    """Restores the model's saved variables, the optimiser and the iterator in place, each
    array into the sharding of its target; returns the extra items (shaped like `extras`)."""
    extras = extras or {}
    restored = self._manager.restore(step, args=ocp.args.Composite(**{
        self._params.name: ocp.args.StandardRestore(
            abstract_state(nnx.state(model, self._params.filter))),
        "opt_state": ocp.args.StandardRestore(abstract_state(nnx.state(optimizer))),
        **{name: ocp.args.StandardRestore(abstract_state(tree)) for name, tree in extras.items()},
        "data": grain.checkpoint.CheckpointRestore(data_iterator),
    }))
    nnx.update(model, restored[self._params.name])
    nnx.update(optimizer, restored.opt_state)
    return {name: restored[name] for name in extras}

  def restore_params(self, step: int, model: nnx.Module) -> None:
    """Restores only the model's saved variables (for evaluation, or onto a backbone)."""
    restored = self._manager.restore(step, args=ocp.args.Composite(**{
        self._params.name: ocp.args.StandardRestore(
            abstract_state(nnx.state(model, self._params.filter)))}))
    nnx.update(model, restored[self._params.name])

  def restore_config(self, step: int) -> ml_collections.ConfigDict:
    restored = self._manager.restore(step, args=ocp.args.Composite(
        config=ocp.args.JsonRestore()))
    return ml_collections.ConfigDict(restored.config)

  def params_bytes(self, step: int) -> int:
    """Bytes on disk of step `step`'s model variables (fine-tuning: one task's storage)."""
    root = os.path.join(str(self._manager.directory), str(step), self._params.name)
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(root)
               for f in files)

  def wait(self) -> None:
    self._manager.wait_until_finished()

  def close(self) -> None:
    self._manager.close()
