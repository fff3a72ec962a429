"""The SPARTAN paper's GLUE average over multi-seed runs (one workdir per task).

  sparse-jax train --config=glue:rte --workdir=runs/rte --seeds=0,1,2  # per task
  sparse-jax glue-average runs/rte runs/cola ... [--mrpc=accuracy|f1|mean] [--out=avg.json]

Each task's score is the paper's (App. C: MNLI-m only, QQP accuracy; MRPC's metric is not
named there, `--mrpc` picks it), in percent, mean and std over the seeds of its `seeds.json`.
"""

import json
import sys

from absl import app, flags

from sparse_jax.tasks.classification_metrics import MRPC_SCORES
from sparse_jax.tasks.seed_runs import glue_average
from sparse_jax.validation import ConfigError

_MRPC = flags.DEFINE_enum("mrpc", "accuracy", list(MRPC_SCORES), "MRPC's number in the average.")
_OUT = flags.DEFINE_string("out", None, "Also write the table as JSON to this file.")


def main(argv):
  workdirs = argv[1:]
  if not workdirs:
    sys.exit("glue_average.py: give the run directories of the tasks (each with seeds.json).")
  try:
    result = glue_average(workdirs, _MRPC.value)
  except (ConfigError, FileNotFoundError, ValueError) as e:
    sys.exit(f"glue_average.py: {e}")
  for task, row in result["tasks"].items():
    print(f"{task:<18} {row['mean']:6.2f} +- {row['std']:5.2f}  ({row['seeds']} seeds)")
  std = result["average_std"]
  print(f"{'average':<18} {result['average']:6.2f}"
        + ("" if std is None else f" +- {std:5.2f}  (std of the per-seed averages)"))
  if _OUT.value:
    with open(_OUT.value, "w", encoding="utf-8") as f:
      json.dump(result, f, indent=2)
    print(f"wrote {_OUT.value}")


def run() -> None:
  """`sparse-jax glue-average`: the command line is `sys.argv`."""
  app.run(main)


if __name__ == "__main__":
  run()
