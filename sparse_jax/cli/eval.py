"""Evaluate a checkpoint of a training run on a whole split.

  sparse-jax eval --workdir=runs/default [--step=N] [--split=validation|test|train]

The model is rebuilt from the config saved with the checkpoint (a fine-tuning run: the
backbone from `backbone.path`, then the saved trainable part; scored with the task's
metrics); results are printed and written to WORKDIR/eval_<split>_<step>.json. The train
split (in eval mode: no dropout) against validation separates underfitting from overfitting.
"""

import sys

from absl import app, flags, logging

from sparse_jax.tasks.classification import HiddenLabelsError
from sparse_jax.tasks.runs import evaluate_checkpoint
from sparse_jax.training import compilation_cache
from sparse_jax.training.checkpointing import NoCheckpointError

_WORKDIR = flags.DEFINE_string("workdir", None, "Run directory holding checkpoints/.",
                               required=True)
_STEP = flags.DEFINE_integer("step", None, "Checkpoint step (default: the latest).")
_SPLIT = flags.DEFINE_enum("split", "validation", ["validation", "test", "train"],
                          "Split to evaluate.")
_MAX_BATCHES = flags.DEFINE_integer("max_batches", None,
                                    "Evaluate only the first N segments (default: all).")
_COMPILATION_CACHE = flags.DEFINE_string(
    "compilation_cache", compilation_cache.default_directory(), compilation_cache.FLAG_HELP)


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)
  compilation_cache.use_compilation_cache(_COMPILATION_CACHE.value)
  try:
    results, path = evaluate_checkpoint(_WORKDIR.value, step=_STEP.value, split=_SPLIT.value,
                                        max_batches=_MAX_BATCHES.value)
  except (NoCheckpointError, HiddenLabelsError) as e:
    sys.exit(f"eval.py: {e}")
  print(", ".join(f"{k}={v:.6g}" if isinstance(v, float) else f"{k}={v}"
                  for k, v in results.items()))
  print(f"wrote {path}")


def run() -> None:
  """`sparse-jax eval`: the command line is `sys.argv`."""
  app.run(main)


if __name__ == "__main__":
  run()
