"""One config over several seeds, the mean and standard deviation of each final metric, and
the SPARTAN paper's GLUE average over tasks (its Tables 1-3 report the mean of 3 seeds).

`run_seeds(config, workdir, seeds)` trains the config once per seed (`config.seed`: the
plug-ins' init, the data order, the few-shot subset, dropout) in `workdir/seed_<s>`, each run
resuming like any other, and writes `workdir/seeds.json`:

    {"task": "glue/rte", "seeds": [0, 1, 2], "per_seed": {"0": {metric: value}, ...},
     "mean": {metric: value}, "std": {metric: value}}

`std` is the sample standard deviation (ddof 1; 0 for one seed). `glue_average(workdirs)`
reads the `seeds.json` of one run per GLUE task and averages the tasks' paper scores
(`classification_metrics.spartan_score`).
"""

import json
import os
from typing import Callable

import jax
import ml_collections
import numpy as np

from sparse_jax import validation
from sparse_jax.tasks.classification_metrics import spartan_score

SUMMARY_FILE = "seeds.json"


def seed_workdir(workdir: str, seed: int) -> str:
  return os.path.join(workdir, f"seed_{seed}")


def summarize(per_seed: dict[int, dict[str, float]]) -> tuple[dict, dict]:
  """`(mean, std)` over seeds of every metric all seeds report."""
  names = sorted(set.intersection(*(set(m) for m in per_seed.values())))
  values = {name: np.array([m[name] for m in per_seed.values()], np.float64) for name in names}
  mean = {name: float(v.mean()) for name, v in values.items()}
  std = {name: float(v.std(ddof=1)) if len(v) > 1 else 0.0 for name, v in values.items()}
  return mean, std


def run_seeds(config: ml_collections.ConfigDict, workdir: str, seeds: list[int],
              train: Callable[[ml_collections.ConfigDict, str], dict]) -> dict | None:
  """Trains `config` with each of `seeds` by `train(config, workdir)` and writes the summary
  (module docstring); returns it, or None when a run was interrupted (re-running resumes)."""
  validation.require(bool(seeds) and len(set(seeds)) == len(seeds), "seeds",
                     "one or more distinct integers", seeds)
  per_seed = {}
  for seed in seeds:
    seed_config = ml_collections.ConfigDict(config.to_dict())
    seed_config.seed = seed
    final = train(seed_config, seed_workdir(workdir, seed))
    if final.get("interrupted"):
      return None
    per_seed[seed] = {k: float(v) for k, v in final.items() if k not in ("step", "interrupted")}
  mean, std = summarize(per_seed)
  task = config.get("task", {}).get("name") or config.get("data", {}).get("name")
  summary = {"task": task, "seeds": list(seeds),
             "per_seed": {str(s): m for s, m in per_seed.items()}, "mean": mean, "std": std}
  if jax.process_index() == 0:
    os.makedirs(workdir, exist_ok=True)
    with open(os.path.join(workdir, SUMMARY_FILE), "w", encoding="utf-8") as f:
      json.dump(summary, f, indent=2)
  return summary


def read_summary(workdir: str) -> dict:
  path = os.path.join(workdir, SUMMARY_FILE)
  if not os.path.exists(path):
    raise FileNotFoundError(f"{path} not found: train the task over seeds first, e.g. "
                            f"`python train.py --config=... --workdir={workdir} --seeds=0,1,2`.")
  with open(path, encoding="utf-8") as f:
    return json.load(f)


def glue_average(workdirs: list[str], mrpc: str = "accuracy") -> dict:
  """The paper's GLUE average of one multi-seed run per task (`workdirs`), in percent.

  Returns `{"tasks": {task: {"mean", "std", "seeds"}}, "average": mean of the tasks' means,
  "average_std": sample std over seeds of the per-seed averages (None unless every task ran
  the same seeds)}`.
  """
  tasks, per_seed_scores = {}, {}
  for workdir in workdirs:
    summary = read_summary(workdir)
    task = summary["task"]
    if task in tasks:
      raise ValueError(f"two runs of {task!r} among {workdirs}; give one per task.")
    scores = {seed: 100 * spartan_score(task, metrics, mrpc)
              for seed, metrics in summary["per_seed"].items()}
    values = np.array(list(scores.values()))
    tasks[task] = {"mean": float(values.mean()), "seeds": len(values),
                   "std": float(values.std(ddof=1)) if len(values) > 1 else 0.0}
    per_seed_scores[task] = scores
  if not tasks:
    raise ValueError("glue_average needs at least one run directory.")
  seed_sets = {tuple(sorted(scores)) for scores in per_seed_scores.values()}
  average_std = None
  if len(seed_sets) == 1 and len(next(iter(seed_sets))) > 1:
    per_seed = [np.mean([scores[s] for scores in per_seed_scores.values()])
                for s in next(iter(seed_sets))]
    average_std = float(np.std(per_seed, ddof=1))
  average = float(np.mean([t["mean"] for t in tasks.values()]))
  return {"tasks": tasks, "average": average, "average_std": average_std}
