"""Train a sparse_jax language model.

  python train.py                                  # configs/default.py into runs/default
  python train.py --config=configs/X.py --workdir=runs/x --config.train.steps=100
  python train.py --config=configs/X.py --print_params   # parameters and % FF FLOPs

Re-running with the same workdir resumes from its latest checkpoint.
"""

import sys

from absl import app, flags, logging
from ml_collections import config_flags

from sparse_jax.models.accounting import model_report
from sparse_jax.training import train_and_evaluate
from sparse_jax.validation import ConfigError

_CONFIG = config_flags.DEFINE_config_file("config", "configs/default.py",
                                          "Experiment config file (get_config()).")
_WORKDIR = flags.DEFINE_string("workdir", None, "Run directory (default: runs/<config name>).")
_PRINT_PARAMS = flags.DEFINE_bool(
    "print_params", False, "Print the model's parameter and FF FLOP counts, then exit.")


def default_workdir(config_path: str) -> str:
  name = config_path.rsplit("/", 1)[-1].removesuffix(".py")
  return f"runs/{name}"


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)
  workdir = _WORKDIR.value or default_workdir(flags.FLAGS["config"].config_filename)
  try:
    if _PRINT_PARAMS.value:
      for name, value in model_report(_CONFIG.value.model).items():
        print(f"{name}: {value:,.1f}" if isinstance(value, float) else f"{name}: {value:,d}")
      return
    final = train_and_evaluate(_CONFIG.value, workdir)
  except ConfigError as e:
    sys.exit(f"train.py: {e}")
  print(f"final ({workdir}): " + ", ".join(f"{k}={v:.4g}" for k, v in final.items()))


if __name__ == "__main__":
  app.run(main)
