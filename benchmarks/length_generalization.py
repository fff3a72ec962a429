"""Length generalisation, Scaling Transformers Table 4: Terraformer vs a Transformer of the
same size on copy and add, trained on up to 128 digits, tested on 256-300.

    python -m benchmarks.length_generalization [--tasks=copy,add] [--steps=N] [--scale=K]
        [--workdir=runs/length_generalization] [--out=benchmarks/length_generalization.json]

Trains `sparse_jax/configs/terraformer_arithmetic.py:<task>` and `:<task>,transformer` (the same
encoder-decoder with dense attention and FF, no SRU, not reversible) into WORKDIR/<run>,
then scores greedy answers on the test split (`eval.py --split=test`: 256-300 digits) and on
the validation split (train lengths). `--models` may add `terraformer_sinusoid`, the ablation:
the Terraformer with fixed sinusoids from position 0 instead of Trax's fixed-base positions.
Prints per-digit and whole-sequence accuracy beside the paper's. Runs already in `--out` are
skipped and every run resumes from its checkpoints, so the comparison can be finished by
later invocations (`train_minutes` then covers the last one, which started after
`resumed_after_step`; `run_minutes`, the table's, the whole run's training over all
invocations, from its `metrics.jsonl`: `training.metrics_log.logged_seconds`).
"""

import argparse
import json
import os
import platform
import time

import jax

from benchmarks.machine import write_json
from benchmarks.quality_small import logged_steps
from sparse_jax.configs import terraformer_arithmetic
from sparse_jax.tasks.runs import evaluate_checkpoint, train_to_completion
from sparse_jax.tasks.selection import task_for
from sparse_jax.training.metrics_log import logged_seconds, read_metrics

# Table 4 (per digit, whole sequence), trained on <= 128 digits, tested on 256-300.
PAPER = {("copy", "terraformer"): (0.999, 0.939), ("copy", "transformer"): (0.798, 0.0),
         ("add", "terraformer"): (0.869, 0.324), ("add", "transformer"): (0.364, 0.0)}
MODELS = ("terraformer", "transformer", "terraformer_sinusoid")


def scaled_lengths(data, scale: int) -> None:
  """Divides the digit-count ranges of `data` (a config section) by `scale`, in place."""
  for field in ("train_max_len", "test_min_len", "test_max_len"):
    data[field] = max(data.train_min_len, data[field] // scale)


def run(task: str, model: str, steps: int | None, scale: int, workdir: str) -> dict:
  """Trains one config (resuming), then scores its greedy answers on validation and test."""
  config = terraformer_arithmetic.get_config(task + (",transformer" if model == MODELS[1] else ""))
  if model == "terraformer_sinusoid":
    config.model.positions = "sinusoid"
  if steps:
    config.train.steps = steps
  scaled_lengths(config.data, scale)
  path = os.path.join(workdir, f"{task}_{model}")
  resumed_from = logged_steps(path)
  started = time.perf_counter()
  train_to_completion(config, path)
  minutes = (time.perf_counter() - started) / 60
  run_seconds = logged_seconds(read_metrics(path), task_for(config).items_per_step)["total"]
  scores = {split: evaluate_checkpoint(path, split=split)[0] for split in ("validation", "test")}
  paper_digit, paper_seq = PAPER.get((task, model), (None, None))
  return {"task": task, "model": model, "steps": config.train.steps,
          "train_digits": [config.data.train_min_len, config.data.train_max_len],
          "test_digits": [config.data.test_min_len, config.data.test_max_len],
          "train_minutes": minutes, "resumed_after_step": resumed_from,
          "run_minutes": run_seconds / 60,
          **{f"{split}_{metric}": scores[split][metric] for split in scores
             for metric in ("per_digit_accuracy", "sequence_accuracy")},
          "paper_per_digit_accuracy": paper_digit, "paper_sequence_accuracy": paper_seq}


def _score(value: float | None) -> str:
  return "-" if value is None else f"{value:.3f}"


def _minutes(row: dict) -> str:
  """The run's minutes over all its invocations; in rows recorded before those were summed,
  the last invocation's, with the step it resumed after, if any."""
  if "run_minutes" in row:
    return f"{row['run_minutes']:.1f}"
  resumed = row.get("resumed_after_step", 0)
  return f"{row['train_minutes']:.1f}" + (f" (after {resumed})" if resumed else "")


def print_table(rows: list[dict]) -> None:
  print("| task | model | steps | train digits | test digits | train min | valid digit | valid seq | test digit | test seq "
        "| paper digit | paper seq |")
  print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
  for r in rows:
    print(f"| {r['task']} | {r['model']} | {r['steps']} | {r['train_digits'][0]}-"
          f"{r['train_digits'][1]} | {r['test_digits'][0]}-{r['test_digits'][1]} "
          f"| {_minutes(r)} "
          f"| {r['validation_per_digit_accuracy']:.3f} | {r['validation_sequence_accuracy']:.3f} "
          f"| {r['test_per_digit_accuracy']:.3f} | {r['test_sequence_accuracy']:.3f} "
          f"| {_score(r['paper_per_digit_accuracy'])} | {_score(r['paper_sequence_accuracy'])} |")


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--tasks", default="copy,add")
  parser.add_argument("--models", default="terraformer,transformer",
                      help=f"comma-separated, of {MODELS}")
  parser.add_argument("--steps", type=int, default=None,
                      help="training steps (default: the config's)")
  parser.add_argument("--scale", type=int, default=1,
                      help="divide every digit count by this (1: the paper's lengths)")
  parser.add_argument("--workdir", default="runs/length_generalization")
  parser.add_argument("--out", default="benchmarks/length_generalization.json")
  args = parser.parse_args(argv)
  result = {"rows": []}
  if os.path.exists(args.out):
    with open(args.out, encoding="utf-8") as f:
      result = json.load(f)
  models = args.models.split(",")
  if not set(models) <= set(MODELS):
    raise SystemExit(f"--models must be a comma-separated subset of {MODELS}; got {args.models!r}")
  for task in args.tasks.split(","):
    for model in models:
      if any(r["task"] == task and r["model"] == model for r in result["rows"]):
        continue
      result["rows"].append(run(task, model, args.steps, args.scale, args.workdir))
      result.update(machine=f"{platform.machine()}, {os.cpu_count()} cores, "
                            f"{jax.default_backend()}", jax=jax.__version__)
      write_json(result, args.out)  # After every run: nothing is lost.
  print_table(result["rows"])
  print(f"wrote {args.out}")


if __name__ == "__main__":
  main()
