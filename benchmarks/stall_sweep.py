"""How often a training recipe stalls: `configs/stall_medium.py` over models, changes and seeds.

    python -m benchmarks.stall_sweep --models=dense,sigma_moe --changes=baseline,fan_in \
        --seeds=0-5 --jobs=2
    python -m benchmarks.stall_sweep --models=dense --changes=baseline,fan_in --seeds=2 --corpus=prose

Trains each (model, change, seed) of `configs/stall_medium.py` (`quality_medium`'s first 1000
steps) on `--corpus` (`builtin`, or `prose`) through `benchmarks.quality_small.run` (a
finished run is read back, an interrupted one resumes; runs live in
`WORKDIR/stall_medium/<corpus id>/<model>/<change>/seed<N>`), `--jobs` runs at a time. A run
*stalled* when `CRITERION` holds at one of its evaluations: the training's stall rule
(`sparse_jax.tasks.copy_score.StallRule`, the warning users see) with `quality_medium`'s
warm-up as its start and window whatever the change does to the warm-up, so every change is
judged alike (copy ratio still >= 0.8 at step 1000, and fell by < 0.1 since step 500). Prints
per corpus and (model, change) the stalled seeds, the stall rate, and the validation bits per
byte and copy ratio at the last step (mean +- sd over the seeds), and writes every run with
its evaluations to `--out`, rewritten as each run finishes.
"""

import argparse
import json
import os

from benchmarks import quality_small
from benchmarks.machine import machine_info, write_result
from sparse_jax.configs import quality_medium, stall_medium
from sparse_jax.tasks import copy_score
from sparse_jax.training.metrics_log import latest_records, read_metrics

CONFIG = "stall_medium"
CRITERION = copy_score.StallRule(
    ratio=copy_score.STALL_RATIO, drop=copy_score.STALL_DROP,
    window=stall_medium.SCHEDULE_STEPS // 10, start=stall_medium.SCHEDULE_STEPS // 10)


def evaluations(workdir: str) -> list[dict]:
  """A run's validation lines: step, bits per byte, copy ratio."""
  return [{"step": r["step"], "bits_per_byte": r["bits_per_byte"], "copy_ratio": r["copy_ratio"]}
          for r in latest_records(read_metrics(workdir), "validation")]


def stalled_at(evals: list[dict]) -> int | None:
  """The first evaluation's step where `CRITERION` holds, or None (`StallDetector`, as the
  training applies its rule)."""
  detector = copy_score.StallDetector(CRITERION)
  for e in evals:
    detector.update(e["step"], e["copy_ratio"])
  return detector.fired_at


def train_one(corpus: str, variant: str, seed: int, root: str) -> dict:
  """One run (`quality_small.run`) with its evaluations and where it stalled."""
  result = dict(quality_small.run(CONFIG, corpus, variant, seed, None, root))
  result["evaluations"] = evaluations(quality_small.run_folder(root, CONFIG, corpus, variant, seed))
  result["stalled_at"] = stalled_at(result["evaluations"])
  return result


def _mean_sd(values: list[float]) -> str:
  if not values:
    return "-"
  mean, sd = quality_small.mean_sd(values)
  return f"{mean:.3f}" + ("" if sd is None else f" +- {sd:.3f}")


def summarise(runs: list[dict]) -> list[dict]:
  """Per corpus and variant (`model/change`): its seeds, the stalled ones, and each run's
  validation bits per byte and copy ratio at its last step."""
  rows = []
  for corpus, variant in dict.fromkeys((r["corpus"], r["variant"]) for r in runs):
    mine = sorted((r for r in runs if (r["corpus"], r["variant"]) == (corpus, variant)),
                  key=lambda r: r["seed"])
    rows.append({"corpus": corpus, "variant": variant, "seeds": [r["seed"] for r in mine],
                 "stalled_seeds": [r["seed"] for r in mine if r["stalled_at"] is not None],
                 "bpb": [r["valid_bits_per_byte"] for r in mine],
                 "copy_ratio": [r["copy_ratio"] for r in mine]})
  return rows


def format_table(rows: list[dict]) -> str:
  lines = [f"| corpus | model/change | stalled / runs | stalled seeds | bpb at step "
           f"{stall_medium.STEPS} | copy ratio |", "|---|---|---:|---|---:|---:|"]
  for r in rows:
    lines.append(f"| {r['corpus']} | {r['variant']} | {len(r['stalled_seeds'])} / "
                 f"{len(r['seeds'])} | {','.join(map(str, r['stalled_seeds'])) or '-'} | "
                 f"{_mean_sd(r['bpb'])} | {_mean_sd(r['copy_ratio'])} |")
  return "\n".join(lines)


def parse_seeds(text: str) -> list[int]:
  """`0-11` or `0,3,5` (or both: `0-3,7`)."""
  seeds = []
  for part in filter(None, text.split(",")):
    low, _, high = part.partition("-")
    seeds.extend(range(int(low), int(high or low) + 1))
  return seeds


def main(argv=None) -> dict:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--models", default="dense", help=f"of {list(quality_medium.VARIANTS)}")
  parser.add_argument("--changes", default="baseline",
                      help=f"comma-separated, of {list(stall_medium.CHANGES)}")
  parser.add_argument("--seeds", default="0-5", help="e.g. 0-5 or 0,3,5")
  parser.add_argument("--corpus", default="builtin", choices=quality_small.CORPORA)
  parser.add_argument("--jobs", type=int, default=1, help="runs trained at a time")
  parser.add_argument("--workdir", default="runs/quality",
                      help="where runs go; a finished run found there is not redone")
  parser.add_argument("--out", default="benchmarks/stall_sweep.json")
  args = parser.parse_args(argv)
  models = quality_small.names(args.models, quality_medium.VARIANTS, "models")
  changes = quality_small.names(args.changes, stall_medium.CHANGES, "changes")
  runs = {}
  if os.path.exists(args.out):
    with open(args.out) as f:
      runs = {(r["corpus"], r["variant"], r["seed"]): r for r in json.load(f)["runs"]}
  machine = machine_info()
  recorded = lambda: {"machine": machine, "args": vars(args),  # noqa: E731
                      "summary": summarise(list(runs.values())), "runs": list(runs.values())}
  todo = [(args.corpus, f"{m}/{c}", s) for m in models for c in changes
          for s in parse_seeds(args.seeds) if (args.corpus, f"{m}/{c}", s) not in runs]
  if args.jobs > 1 and todo:
    quality_small.prepare_corpora(CONFIG, [args.corpus], args.workdir)
  calls = [(*key, args.workdir) for key in todo]
  for (corpus, variant, seed, _), result in quality_small.in_processes(train_one, calls,
                                                                        args.jobs):
    runs[corpus, variant, seed] = result
    print(f"{corpus} {variant} seed {seed}: stalled at {result['stalled_at']}", flush=True)
    write_result(recorded(), args.out)
  result = recorded()
  print(format_table(result["summary"]))
  return result


if __name__ == "__main__":
  main()
