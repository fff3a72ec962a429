"""Train a sparse_jax language model.

  python train.py                                  # configs/default.py into runs/default
  python train.py --config=configs/X.py --workdir=runs/x --config.train.steps=100

Re-running with the same workdir resumes from its latest checkpoint.
"""

from absl import app, flags, logging
from ml_collections import config_flags

from sparse_jax.training import train_and_evaluate

_CONFIG = config_flags.DEFINE_config_file("config", "configs/default.py",
                                          "Experiment config file (get_config()).")
_WORKDIR = flags.DEFINE_string("workdir", None, "Run directory (default: runs/<config name>).")


def default_workdir(config_path: str) -> str:
  name = config_path.rsplit("/", 1)[-1].removesuffix(".py")
  return f"runs/{name}"


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)
  workdir = _WORKDIR.value or default_workdir(flags.FLAGS["config"].config_filename)
  final = train_and_evaluate(_CONFIG.value, workdir)
  print(f"final ({workdir}): " + ", ".join(f"{k}={v:.4g}" for k, v in final.items()))


if __name__ == "__main__":
  app.run(main)
