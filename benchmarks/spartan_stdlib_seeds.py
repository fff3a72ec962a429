"""SPARTAN and its baselines on the offline task, the mean and std of 3 seeds (SPARTAN Table 1's
protocol on `sparse_jax/configs/spartan_stdlib.py`).

    python -m benchmarks.spartan_stdlib_seeds [--methods=spartan,houlsby,pfeiffer,full]
        [--seeds=0,1,2] [--workdir=runs/stdlib_seeds] [--out=benchmarks/spartan_stdlib_seeds.json]

Pretrains the byte LM backbone as `python train.py` does (into WORKDIR/backbone, unless it is
there), then trains `sparse_jax/configs/spartan_stdlib.py:<method>` over the seeds
(`tasks.seed_runs.run_seeds`, WORKDIR/<method>/seed_<s>) and prints one table: validation
accuracy and Matthews correlation, mean +- sample std, trainable parameters and minutes per
run. Methods already in `--out` are kept and skipped, so a long comparison can be finished by
later invocations (every run also resumes from its checkpoints).
"""

import argparse
import json
import os
import platform
import time

import jax

from sparse_jax.configs import default, spartan_stdlib
from sparse_jax.tasks.runs import train_to_completion
from sparse_jax.tasks.seed_runs import run_seeds

METRICS = ("accuracy", "matthews_corrcoef")


def pretrain_backbone(workdir: str) -> str:
  path = os.path.join(workdir, "backbone")
  train_to_completion(default.get_config(), path)  # resumes, or only evaluates when finished
  return path


def run_method(method: str, seeds: list[int], backbone: str, workdir: str) -> dict:
  config = spartan_stdlib.get_config(method)
  config.backbone.path = backbone
  started = time.perf_counter()
  summary = run_seeds(config, os.path.join(workdir, method), seeds, train_to_completion)
  if summary is None:
    raise SystemExit("interrupted: run the same command again to resume.")
  return {"method": method, "seeds": seeds, "minutes_per_run":
          (time.perf_counter() - started) / 60 / len(seeds),
          **{f"{m}_mean": summary["mean"][m] for m in METRICS},
          **{f"{m}_std": summary["std"][m] for m in METRICS},
          "trainable_params": int(summary["mean"]["trainable_params"]),
          "per_seed": summary["per_seed"]}


def print_table(rows: list[dict]) -> None:
  print(f"{'method':<10} {'accuracy':>17} {'matthews':>17} {'trainable':>10} {'min/run':>8}")
  for r in rows:
    print(f"{r['method']:<10} {r['accuracy_mean']:>9.4f} +- {r['accuracy_std']:.4f} "
          f"{r['matthews_corrcoef_mean']:>9.4f} +- {r['matthews_corrcoef_std']:.4f} "
          f"{r['trainable_params']:>10,d} {r['minutes_per_run']:>8.1f}")


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--methods", default="spartan,houlsby,pfeiffer,full")
  parser.add_argument("--seeds", default="0,1,2")
  parser.add_argument("--workdir", default="runs/stdlib_seeds")
  parser.add_argument("--out", default="benchmarks/spartan_stdlib_seeds.json")
  args = parser.parse_args(argv)
  seeds = [int(s) for s in args.seeds.split(",")]
  result = {"rows": []}
  if os.path.exists(args.out):
    with open(args.out) as f:
      result = json.load(f)
  backbone = pretrain_backbone(args.workdir)
  for method in args.methods.split(","):
    if any(r["method"] == method and r["seeds"] == seeds for r in result["rows"]):
      continue
    result["rows"].append(run_method(method, seeds, backbone, args.workdir))
    result.update({"machine": f"{platform.machine()}, {os.cpu_count()} cores, "
                              f"{jax.default_backend()}", "jax": jax.__version__})
    with open(args.out, "w") as f:  # after every method: nothing finished is lost
      json.dump(result, f, indent=2)
  print_table(result["rows"])
  print(f"wrote {args.out}")


if __name__ == "__main__":
  main()
