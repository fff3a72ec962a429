"""Orbax checkpoints of a training run under `WORKDIR/checkpoints`, for every task.

Each step directory holds the model variables the task keeps (item `params` for a language
model: every variable but RNG state; item `trainable` for fine-tuning: only what trains, so a
task costs the size of its trainable part on disk, SPARTAN App. E), the optimiser state
(`opt_state`), the task's named extra items (a language model's XL memory), the grain
iterator state (`data`) and the config as JSON, so a run resumes exactly where it stopped and
`eval.py` rebuilds the model from the checkpoint alone. RNG state is not saved: the training
step derives its randomness from (seed, step).

Faults: Orbax writes each step into a temporary directory renamed into place when complete,
so a process killed mid-save leaves no partial step (the leftover temporary directory is
removed at the next start). A step that is there but does not read back (a file truncated or
deleted afterwards) is moved to `WORKDIR/broken_checkpoints/` with a warning and the run
resumes from the step before it (`restore_latest`); a failed write (disk full, I/O error)
stops the run with `CheckpointWriteError`, the earlier steps untouched.
"""

import dataclasses
import os
import re
import shutil
from collections.abc import Callable

import grain
import jax
import ml_collections
import orbax.checkpoint as ocp
from jax.experimental import multihost_utils
from absl import logging
from flax import nnx

from sparse_jax.training import resume_config

NOT_RNG = nnx.Not(nnx.RngState)


@dataclasses.dataclass(frozen=True)
class ParamsItem:
  """Which model variables a checkpoint holds, and the item they are stored under."""

  name: str = "params"
  filter: nnx.filterlib.Filter = NOT_RNG


def checkpoint_dir(workdir: str) -> str:
  return os.path.join(os.path.abspath(workdir), "checkpoints")


def broken_dir(workdir: str) -> str:
  """Where steps that do not read back are moved (kept, for inspection)."""
  return os.path.join(os.path.abspath(workdir), "broken_checkpoints")


def abstract_state(tree):
  return jax.tree.map(ocp.utils.to_shape_dtype_struct, tree)


class CheckpointWriteError(RuntimeError):
  """Writing a checkpoint failed (disk full, permissions, I/O); earlier steps are intact."""


class NoCheckpointError(FileNotFoundError):
  """The workdir holds no checkpoint (or not the requested step)."""


class CheckpointRestoreError(RuntimeError):
  """No checkpoint of a run reads back; none was moved or deleted."""


_OS_ERROR_CODE = re.compile(r"os_error_code='?(\d+)")


def _summary(error: BaseException, keep: int = 200) -> str:
  """An exception's type and first line, its middle elided past `2 * keep` characters
  (TensorStore's messages name long paths and specs), followed by the OS error it reports
  (`[os_error_code='27']` -> "File too large"), which may sit anywhere in the message or be
  given only as a number."""
  lines = str(error).strip().splitlines()
  text = lines[0] if lines else ""
  if len(text) > 2 * keep:
    text = f"{text[:keep]} ... {text[-keep:]}"
  codes = dict.fromkeys(int(code) for code in _OS_ERROR_CODE.findall(str(error)))
  reasons = "".join(f"; OS error {code}: {os.strerror(code)}" for code in codes)
  return f"{type(error).__name__}: {text}{reasons}"


def _remove_leftovers(directory: str) -> None:
  """Removes the temporary directories of saves that never completed (a killed run), as
  Orbax's `cleanup_tmp_directories` does (the same listing, `ocp.path.step`, on the primary
  process), but before the manager exists and synchronously: Orbax runs its cleanup in a
  thread that only its first `save` awaits (orbax-checkpoint 0.12), so a run stopping before
  it saves (a refused config, missing data) would leave that thread to fail at interpreter
  exit, a traceback printed after the run's own message."""
  if jax.process_index() == 0:
    for leftover in ocp.path.step.all_temporary_paths(directory):
      leftover.get().rmtree()


class Checkpointer:
  """Saves and restores training runs; never deletes the last good checkpoint."""

  def __init__(self, workdir: str, *, max_to_keep: int = 3, params: ParamsItem = ParamsItem(),
               read_only: bool = False):
    """`read_only`: for evaluation and loading, which may run beside the training run that
    writes `workdir`: nothing is created, and the temporary directory of a save in flight is
    left alone (a writer removes a killed run's leftovers when it starts)."""
    # (Not Orbax's own `read_only`, which logs a warning on every use.)
    if not read_only:
      _remove_leftovers(checkpoint_dir(workdir))
    options = ocp.CheckpointManagerOptions(max_to_keep=max_to_keep, create=not read_only,
                                           cleanup_tmp_directories=False)  # Done above.
    self._workdir = workdir
    self._manager = ocp.CheckpointManager(checkpoint_dir(workdir), options=options)
    self._params = params
    self._writing: int | None = None  # The step of the save in flight, if any.

  def latest_step(self) -> int | None:
    return self._manager.latest_step()

  def all_steps(self) -> list[int]:
    return list(self._manager.all_steps())

  def resolve_step(self, step: int | None, *, how_to_make_one: str) -> int:
    """`step` if it was saved, the latest step for None; else `NoCheckpointError` naming the
    directory, the steps there and `how_to_make_one` (e.g. "train first with ...")."""
    steps = self.all_steps()
    where = checkpoint_dir(self._workdir)
    if not steps:
      raise NoCheckpointError(f"no checkpoint in {where}: {how_to_make_one}.")
    step = max(steps) if step is None else step
    if step not in steps:
      raise NoCheckpointError(f"no checkpoint of step {step} in {where}; available steps: "
                              f"{sorted(steps)}.")
    return step

  def save(self, step: int, *, model: nnx.Module, optimizer: nnx.Optimizer,
           data_iterator: grain.DatasetIterator, config: ml_collections.ConfigDict,
           extras: dict | None = None) -> None:
    """Saves asynchronously (`extras`: item name -> pytree of arrays); call `wait()` before
    relying on the files. Raises `CheckpointWriteError` if this or the previous save failed."""
    self.check_writes()
    if step in self._manager.all_steps():
      return
    try:
      self._manager.save(step, args=ocp.args.Composite(**{
          self._params.name: ocp.args.StandardSave(nnx.state(model, self._params.filter)),
          "opt_state": ocp.args.StandardSave(nnx.state(optimizer)),
          **{name: ocp.args.StandardSave(tree) for name, tree in (extras or {}).items()},
          "data": grain.checkpoint.CheckpointSave(data_iterator),
          "config": ocp.args.JsonSave(config.to_dict()),
      }))
    except Exception as e:  # pylint: disable=broad-except
      raise self._write_error(step, e) from e
    self._writing = step

  def _write_error(self, step: int | None, error: BaseException) -> CheckpointWriteError:
    self._manager.reload()
    good = self._manager.latest_step()
    kept = (f"The last good checkpoint, step {good}, is intact: fix the cause (free disk "
            f"space) and run the same command again to resume from it." if good is not None
            else "No earlier checkpoint exists.")
    return CheckpointWriteError(
        f"writing the checkpoint of step {step} to {checkpoint_dir(self._workdir)} failed "
        f"({_summary(error)}); training stopped. {kept}")

  def check_writes(self) -> None:
    """Raises `CheckpointWriteError` if a background save has failed (does not wait)."""
    try:
      self._manager.check_for_errors()
    except Exception as e:  # pylint: disable=broad-except
      raise self._write_error(self._writing, e) from e

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

  def check_resume(self, config: ml_collections.ConfigDict,
                   resolve: Callable[[ml_collections.ConfigDict], dict]) -> None:
    """Raises `ConfigError` unless `config` (resolved: every default filled in) may resume
    from the newest step whose saved config reads back (`resume_config.check_resumable`,
    naming every refused field); logs the accepted changes. The saved config is resolved by
    `resolve` first, so a checkpoint that stored only what its config file set (before
    checkpoints stored resolved configs) compares by value too. Cheap: reads JSON only, so a
    run checks it before building anything."""
    for step in sorted(self.all_steps(), reverse=True):
      try:
        saved = self.restore_config(step)
      except Exception:  # pylint: disable=broad-except  # Unreadable: `restore_latest` decides.
        continue
      saved = resolve(resume_config.with_fields_added_since(saved))
      for path, (old, new) in resume_config.check_resumable(
          saved, config, workdir=self._workdir, step=step).items():
        logging.warning("Resuming with config field %s changed: %r -> %r.", path, old, new)
      return

  def restore_latest(self, *, model: nnx.Module, optimizer: nnx.Optimizer,
                     data_iterator: grain.DatasetIterator, extras: dict | None = None
                     ) -> tuple[int, dict] | None:
    """Restores the newest step that reads back whole; `(step, extras)`, or None if there are
    no checkpoints.

    A step whose files fail to read (truncated, deleted) is tried no further: once an older
    step restores, every newer one that failed is moved to `broken_dir(workdir)` with a
    warning naming it, so the run saves those steps anew. If no step restores, raises
    `CheckpointRestoreError` naming each and moves nothing: a run never starts fresh on its
    own.
    """
    failed = []
    for step in sorted(self.all_steps(), reverse=True):
      try:
        self.restore_config(step)  # `eval.py` and `load` need it too.
        restored = self.restore(step, model=model, optimizer=optimizer,
                                data_iterator=data_iterator, extras=extras)
      except Exception as e:  # pylint: disable=broad-except
        failed.append((step, e))
        continue
      for broken, error in failed:
        self._set_aside(broken, error, step)
      return step, restored
    if failed:
      listed = "\n".join(f"  step {step}: {_summary(e)}" for step, e in failed)
      raise CheckpointRestoreError(
          f"no checkpoint in {checkpoint_dir(self._workdir)} reads back:\n{listed}\nNothing "
          f"was moved or deleted. To start fresh, use another --workdir or delete that "
          f"directory.")
    return None

  def _set_aside(self, step: int, error: BaseException, fallback: int) -> None:
    """Moves broken step `step` out of the checkpoint directory, keeping its files. Every
    process found it broken (they read the same files); the first moves it, and all wait for
    that before listing the steps again, so that they agree on which steps exist."""
    if jax.process_index() == 0:
      target = os.path.join(broken_dir(self._workdir), str(step))
      suffix = 1
      while os.path.exists(target):
        target = os.path.join(broken_dir(self._workdir), f"{step}.{suffix}")
        suffix += 1
      os.makedirs(broken_dir(self._workdir), exist_ok=True)
      shutil.move(os.path.join(checkpoint_dir(self._workdir), str(step)), target)
      logging.warning("The checkpoint of step %d does not read back (%s); moved it to %s and "
                      "resuming from step %d.", step, _summary(error), target, fallback)
    if jax.process_count() > 1:
      multihost_utils.sync_global_devices(f"set_aside_checkpoint_{step}")
    self._manager.reload()

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
    """Waits for the save in flight; raises `CheckpointWriteError` if it failed."""
    try:
      self._manager.wait_until_finished()
    except Exception as e:  # pylint: disable=broad-except
      raise self._write_error(self._writing, e) from e

  def close(self) -> None:
    self._manager.close()
