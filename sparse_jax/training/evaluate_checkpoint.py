"""Evaluation of a saved checkpoint: what `eval.py` runs."""

import json
import os

from sparse_jax.training.saved_runs import saved_config
from sparse_jax.training.tasks import task_for


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
