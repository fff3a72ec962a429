"""Evaluation of a saved checkpoint: what `eval.py` runs."""

import json
import os

from sparse_jax.training.checkpointing import Checkpointer, checkpoint_dir
from sparse_jax.training.tasks import task_for


class NoCheckpointError(FileNotFoundError):
  """The workdir holds no checkpoint (or not the requested step)."""


def _saved_config(workdir: str, step: int | None):
  """`(step, config)` of checkpoint `step` (default: the latest) in `workdir`."""
  checkpointer = Checkpointer(workdir)
  try:
    steps = checkpointer.all_steps()
    if not steps:
      raise NoCheckpointError(f"no checkpoint in {checkpoint_dir(workdir)}: train first with "
                              f"`python train.py --workdir={workdir}`.")
    step = max(steps) if step is None else step
    if step not in steps:
      raise NoCheckpointError(f"no checkpoint of step {step} in {checkpoint_dir(workdir)}; "
                              f"available steps: {sorted(steps)}.")
    return step, checkpointer.restore_config(step)
  finally:
    checkpointer.close()


def evaluate_checkpoint(workdir: str, *, step: int | None = None, split: str = "validation",
                        max_batches: int | None = None) -> tuple[dict, str]:
  """Restores `workdir`'s checkpoint `step` (default latest) and evaluates `split` with the
  task of the saved config (a language model: loss and bits per byte or perplexity with the
  saved `eval.mem_len`, on the saved config's mesh; a fine-tuning run: the task's metrics,
  the backbone rebuilt from `backbone` and the saved trainable part put on it). Returns the
  metrics and the path of the JSON file they were written to,
  `WORKDIR/eval_<split>_<step>.json`.
  """
  step, config = _saved_config(workdir, step)
  metrics = task_for(config).evaluate_checkpoint(workdir, step, split, max_batches)
  results = {"step": step, "split": split, **metrics}
  path = os.path.join(workdir, f"eval_{split}_{step}.json")
  with open(path, "w", encoding="utf-8") as f:
    json.dump(results, f, indent=2)
  return results, path
