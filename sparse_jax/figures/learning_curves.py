"""Learning curves of several runs on one plot, from their `metrics.jsonl`.

`MetricsWriter` appends one line per log step, `{"step": s, "split": "train"|"validation",
**metrics}`; a resumed run may log a step twice (the steps after its last checkpoint run
again), in which case the later line wins. Train and validation points of a metric are
separate series.
"""

import os

from sparse_jax.figures import output
from sparse_jax.training.metrics_log import latest_records, read_metrics


def _series(records: list[dict], metric: str) -> dict[str, dict[str, list]]:
  """`{split: {"steps": [...], "values": [...]}}` for the splits that logged `metric`, from
  each step's latest line (one without `metric` leaves its step out)."""
  series = {}
  for split in dict.fromkeys(record["split"] for record in records):
    points = [r for r in latest_records(records, split) if metric in r]
    if points:
      series[split] = {"steps": [r["step"] for r in points],
                       "values": [r[metric] for r in points]}
  return series


def run_labels(run_dirs: list[str]) -> list[str]:
  """Each run's label: the fewest trailing path components that tell the runs apart
  (`sigma_moe/seed0` and `dense/seed0`, not `seed0` twice)."""
  parts = [os.path.normpath(run_dir).split(os.sep) for run_dir in run_dirs]
  for n in range(1, max(map(len, parts)) + 1):
    labels = ["/".join(p[-n:]) for p in parts]
    if len(set(labels)) == len(labels):
      return labels
  return labels


def compute_learning_curves(run_dirs: list[str], metric: str = "loss") -> dict:
  """Per run (labelled by `run_labels`): the series of `metric` per split."""
  runs = []
  available = set()
  for run_dir, label in zip(run_dirs, run_labels(run_dirs)):
    records = read_metrics(run_dir)
    available.update(k for r in records for k in r if k not in ("step", "split"))
    runs.append({"label": label, "run_dir": run_dir, "series": _series(records, metric)})
  if not any(run["series"] for run in runs):
    raise ValueError(f"no run logged metric {metric!r}; logged metrics: {sorted(available)}.")
  return {"metric": metric, "runs": runs}


def plot_learning_curves(numbers: dict):
  """One axes: a full line per run's train series, dots and dashes per validation series."""
  fig, (ax,) = output.new_figure(width=6.0)
  for run in numbers["runs"]:
    for split, series in sorted(run["series"].items()):
      style = "-" if split == "train" else "o--"
      ax.plot(series["steps"], series["values"], style, label=f"{run['label']} ({split})")
  ax.set_xlabel("step")
  ax.set_ylabel(numbers["metric"])
  ax.legend(fontsize="small")
  return fig


def make_learning_curves(run_dirs: list[str], out_dir: str, *, metric: str = "loss",
                         name: str = "learning_curves") -> dict[str, str]:
  """Computes (`compute_learning_curves`), plots and saves."""
  numbers = compute_learning_curves(run_dirs, metric)
  return output.save(plot_learning_curves(numbers), numbers, out_dir, name)
