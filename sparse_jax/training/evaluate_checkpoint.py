"""Evaluation of a saved checkpoint: what `eval.py` runs."""

import json
import os

from sparse_jax import data, parallel
from sparse_jax.training.checkpointing import Checkpointer, checkpoint_dir
from sparse_jax.training.finetune import evaluate_task_checkpoint, is_finetune_config
from sparse_jax.training.placement import Placement
from sparse_jax.training.trainer import build_model, make_evaluator


class NoCheckpointError(FileNotFoundError):
  """The workdir holds no checkpoint (or not the requested step)."""


def evaluate_checkpoint(workdir: str, *, step: int | None = None, split: str = "validation",
                        max_batches: int | None = None) -> tuple[dict, str]:
  """Restores `workdir`'s checkpoint `step` (default latest) and evaluates `split`.

  A fine-tuning run (its config has a `task` section) is scored with the task's metrics: the
  backbone is rebuilt from `backbone` and the saved trainable part put on it. A language model
  is restored sharded onto the mesh of the saved config's `mesh` section over this job's
  devices. The memory length is the saved config's `eval.mem_len`. Token
  (SentencePiece) datasets report perplexity per token and per word. Returns the metrics and
  the path of the JSON file they were written to.
  """
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
    config = checkpointer.restore_config(step)
    if is_finetune_config(config):
      return _write(workdir, split, step, {
          "step": step, "split": split,
          **evaluate_task_checkpoint(workdir, config, step, split)})
    placement = Placement(parallel.mesh_from_config(config.get("mesh", {})))
    model = placement.create(lambda: build_model(config))
    checkpointer.restore_params(step, model)
  finally:
    checkpointer.close()
  loaded = data.load_split(config.data, split)
  evaluator = make_evaluator(config, model, placement)
  metrics = evaluator(model, loaded.tokens, max_batches=max_batches,
                      words_per_token=loaded.words_per_token)
  return _write(workdir, split, step,
                {"step": step, "split": split, "mem_len": config.eval.mem_len, **metrics})


def _write(workdir: str, split: str, step: int, results: dict) -> tuple[dict, str]:
  path = os.path.join(workdir, f"eval_{split}_{step}.json")
  with open(path, "w", encoding="utf-8") as f:
    json.dump(results, f, indent=2)
  return results, path
