"""Runs of a task: train one from a config, and read a saved one back.

`train_and_evaluate(config, workdir)` trains the task a config selects (`tasks.task_for`) on
the engine (`training.loop.run_task`). `load(workdir)` is what notebooks use to evaluate or
sample from a run (`sparse_jax.load`); `evaluate_checkpoint(workdir)` is what `eval.py`
runs. Both find the checkpoint step the same way (`saved_config`).
"""

import json
import os

import ml_collections
from flax import nnx
from jax.sharding import Mesh

from sparse_jax.tasks.selection import task_for
from sparse_jax.training.checkpointing import Checkpointer
from sparse_jax.training.loop import run_task
from sparse_jax.training.resume_config import with_fields_added_since


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str, *,
                       mesh: Mesh | None = None) -> dict[str, float]:
  """Trains `config` in `workdir` (resuming if it holds checkpoints); returns the final
  validation metrics (`training.loop.run_task`).

  The task is chosen by the config (`tasks.task_for`), which validates it before any data is
  read or model built. Runs on `mesh` (default: the mesh of `config.mesh` over this job's
  devices).
  """
  return run_task(task_for(config), workdir, mesh)


class RunInterrupted(RuntimeError):
  """A run SIGTERM/SIGINT stopped before its last step (its checkpoint is saved)."""


def train_to_completion(config: ml_collections.ConfigDict, workdir: str, *,
                        mesh: Mesh | None = None) -> dict[str, float]:
  """`train_and_evaluate` for callers that record the result (benchmarks): raises
  `RunInterrupted` instead of returning the metrics of a run stopped early, so that a
  partial run is never recorded as finished; running it again resumes it."""
  final = train_and_evaluate(config, workdir, mesh=mesh)
  if final.get("interrupted"):
    raise RunInterrupted(f"the run in {workdir} was stopped at step {final['step']} "
                         f"(checkpoint saved); run the same command again to resume it.")
  return final


def saved_config(workdir: str, step: int | None = None
                 ) -> tuple[int, ml_collections.ConfigDict]:
  """`(step, config)` of checkpoint `step` (default: the latest) in `workdir`, with fields
  added since it was saved set as they were (`with_fields_added_since`); raises
  `training.checkpointing.NoCheckpointError` naming the directory and the steps there."""
  checkpointer = Checkpointer(workdir, read_only=True)
  try:
    step = checkpointer.resolve_step(
        step, how_to_make_one=f"train first with `python train.py --workdir={workdir}`")
    return step, with_fields_added_since(checkpointer.restore_config(step))
  finally:
    checkpointer.close()


def load(workdir: str, step: int | None = None
         ) -> tuple[nnx.Module, ml_collections.ConfigDict]:
  """`(model, config)` of `workdir`'s checkpoint `step` (default: the latest).

  The model is rebuilt from the config saved with the checkpoint and its saved variables are
  restored into it, on the default device, in eval mode: a `TransformerLM` for a language
  model, a `Terraformer` for sequence to sequence, a `SequenceClassifier` for fine-tuning
  (the backbone rebuilt from `backbone`, the saved trainable part put on it). The config is
  the saved one (`config.train.steps` etc. as trained).
  """
  step, config = saved_config(workdir, step)
  return task_for(config).restore_model(workdir, step), config


def evaluate_checkpoint(workdir: str, *, step: int | None = None, split: str = "validation",
                        max_batches: int | None = None) -> tuple[dict, str]:
  """Restores `workdir`'s checkpoint `step` (default latest) and evaluates `split` with the
  task of the saved config (a language model: loss and bits per byte or perplexity with the
  saved `eval.mem_len`, on the saved config's mesh; a fine-tuning run: the task's metrics,
  the backbone rebuilt from `backbone` and the saved trainable part put on it). Returns the
  metrics and the path of the JSON file they were written to,
  `WORKDIR/eval_<split>_<step>.json`.
  """
  step, config = saved_config(workdir, step)
  metrics = task_for(config).evaluate_checkpoint(workdir, step, split, max_batches)
  results = {"step": step, "split": split, **metrics}
  path = os.path.join(workdir, f"eval_{split}_{step}.json")
  with open(path, "w", encoding="utf-8") as f:
    json.dump(results, f, indent=2)
  return results, path
