"""How often a training recipe stalls: the stall probe over models, recipes and seeds.

    python -m benchmarks.stall_sweep --models=dense,sigma_moe --changes=baseline,fan_in \
        --seeds=0-5 --jobs=2
    python -m benchmarks.stall_sweep --models=dense --changes=baseline,fan_in --seeds=2 --corpus=prose
    python -m benchmarks.stall_sweep --models=dense,sigma_moe \
        --changes=fan_in,fan_in+residual_zero --seeds=0-7
    python -m benchmarks.stall_sweep --probe=default --models=sigma_moe \
        --changes=baseline,fan_in,fan_in+residual_zero --seeds=0

Trains each (model, recipe, seed) of the probe, `stall_medium`
(`sparse_jax/configs/stall_medium.py`, `quality_medium`'s first 1000 steps; a recipe is one of
its changes or several joined with `+`), on `--corpus` (`builtin`, or `prose`) through
`benchmarks.quality_small.run` (a finished run is read back, an interrupted one resumes; runs
live in `WORKDIR/<probe>/<corpus id>/<model>/<recipe>/seed<N>`), `--jobs` runs at a time;
`--probe=default` trains `python train.py`'s run instead (the embedded default or its dense
twin, 400 steps) under each recipe, to see what a recipe does to a new user's first run. A run
*stalled* when the probe's criterion (`criterion`) holds at one of its evaluations: the
training's stall rule (`sparse_jax.tasks.copy_score.StallRule`, the warning users see) with the
probe's warm-up as its start and window whatever the change does to the warm-up, so every change
is judged alike (copy ratio still >= 0.8 at step 1000, and fell by < 0.1 since step 500). Prints
per corpus and (model, change) the stalled seeds, the stall rate, and the validation bits per
byte and copy ratio at the last step (mean +- sd over the seeds), and writes every run (its
`recipe`, `model`, `stalled`, evaluations and resolved config) to `--out`, rewritten as each run
finishes.
"""

import argparse
import json
import os

from benchmarks import quality_small
from benchmarks.machine import machine_info, write_result
from sparse_jax.configs import stall_medium
from sparse_jax.tasks import copy_score
from sparse_jax.training.metrics_log import latest_records, read_metrics

# Where each `--probe`'s runs are recorded: `stall_medium`, or `python train.py`'s own run
# (`default`: the embedded default, 400 steps, too short to be judged) under each recipe.
OUTS = {"stall_medium": "benchmarks/stall_sweep.json", "default": "benchmarks/recipe_default.json"}


def criterion() -> copy_score.StallRule:
  """The training's stall rule over the probe's warm-up, whatever a change does to it."""
  warmup = stall_medium.SCHEDULE_STEPS // 10
  return copy_score.StallRule(ratio=copy_score.STALL_RATIO, drop=copy_score.STALL_DROP,
                              window=warmup, start=warmup)


def evaluations(workdir: str) -> list[dict]:
  """A run's validation lines: step, bits per byte, copy ratio, and whether the training's
  stall warning fired there (`copy_stalled`)."""
  return [{"step": r["step"], "bits_per_byte": r["bits_per_byte"], "copy_ratio": r["copy_ratio"],
           "warned": bool(r.get("copy_stalled"))}
          for r in latest_records(read_metrics(workdir), "validation")]


def stalled_at(evals: list[dict]) -> int | None:
  """The first evaluation's step where the probe's `criterion` holds, or None
  (`StallDetector`, as the training applies its rule)."""
  detector = copy_score.StallDetector(criterion())
  for e in evals:
    detector.update(e["step"], e["copy_ratio"])
  return detector.fired_at


def train_one(probe: str, corpus: str, variant: str, seed: int, root: str) -> dict:
  """One run (`quality_small.run`) with its evaluations, where it stalled and whether."""
  result = dict(quality_small.run(probe, corpus, variant, seed, None, root))
  folder = quality_small.run_folder(root, probe, corpus, variant, seed)
  result["evaluations"] = evaluations(folder)
  result["stalled_at"] = stalled_at(result["evaluations"])
  result["model"], _, result["recipe"] = variant.partition("/")
  result["stalled"] = result["stalled_at"] is not None
  result["warned"] = any(e["warned"] for e in result["evaluations"])
  return result


def _mean_sd(values: list[float], fmt: str = ".3f") -> str:
  if not values:
    return "-"
  mean, sd = quality_small.mean_sd(values)
  return f"{mean:{fmt}}" + ("" if sd is None else f" +- {sd:{fmt.lstrip('+')}}")


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
                 "bpb_not_stalled": [r["valid_bits_per_byte"] for r in mine
                                     if r["stalled_at"] is None],
                 "copy_ratio": [r["copy_ratio"] for r in mine]})
  return rows


def paired(runs: list[dict], treated: str = "sigma_moe", control: str = "dense") -> list[dict]:
  """Per corpus and recipe run with both models: `treated` minus `control` validation bits per
  byte in percent of `control`'s, paired by seed, over every seed both have (stalled or not)."""
  def bpb_by_seed(corpus: str, variant: str) -> dict[int, float]:
    return {r["seed"]: r["valid_bits_per_byte"] for r in runs
            if (r["corpus"], r["variant"]) == (corpus, variant)}

  rows = []
  for corpus, variant in dict.fromkeys((r["corpus"], r["variant"]) for r in runs):
    model, _, recipe = variant.partition("/")
    if model != treated:
      continue
    diffs = quality_small.paired_percent(bpb_by_seed(corpus, variant),
                                         bpb_by_seed(corpus, f"{control}/{recipe}"))
    if diffs:
      rows.append({"corpus": corpus, "recipe": recipe, "seeds": list(diffs),
                   "diff_percent": list(diffs.values())})
  return rows


def alarms(runs: list[dict]) -> dict:
  """The training's stall warning against the probe's criterion over `runs` that record it:
  false alarms (warned, did not stall) and missed ones (stalled, no warning)."""
  judged = [r for r in runs if "warned" in r]
  return {"runs": len(judged),
          "false": sorted((r["variant"], r["seed"]) for r in judged
                          if r["warned"] and not r["stalled"]),
          "missed": sorted((r["variant"], r["seed"]) for r in judged
                           if r["stalled"] and not r["warned"])}


def format_table(rows: list[dict], steps: int = stall_medium.STEPS) -> str:
  lines = [f"| corpus | model/change | stalled / runs | stalled seeds | bpb at step "
           f"{steps} | bpb, runs that did not stall | copy ratio |",
           "|---|---|---:|---|---:|---:|---:|"]
  for r in rows:
    lines.append(f"| {r['corpus']} | {r['variant']} | {len(r['stalled_seeds'])} / "
                 f"{len(r['seeds'])} | {','.join(map(str, r['stalled_seeds'])) or '-'} | "
                 f"{_mean_sd(r['bpb'])} | {_mean_sd(r.get('bpb_not_stalled', []))} | "
                 f"{_mean_sd(r['copy_ratio'])} |")
  return "\n".join(lines)


def format_paired(rows: list[dict]) -> str:
  lines = ["| corpus | recipe | seeds | sigma-MoE - dense, % of dense (mean +- sd) |",
           "|---|---|---:|---:|"]
  for r in rows:
    lines.append(f"| {r['corpus']} | {r['recipe']} | {len(r['seeds'])} | "
                 f"{_mean_sd(r['diff_percent'], '+.2f')} |")
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
  parser.add_argument("--models", default="dense", help="of the probe's models")
  parser.add_argument("--changes", default="baseline",
                      help="comma-separated recipes: each one of the probe's CHANGES or several "
                           "joined by '+'")
  parser.add_argument("--seeds", default="0-5", help="e.g. 0-5 or 0,3,5")
  parser.add_argument("--corpus", default="builtin", choices=quality_small.CORPORA)
  parser.add_argument("--jobs", type=int, default=1, help="runs trained at a time")
  parser.add_argument("--workdir", default="runs/quality",
                      help="where runs go; a finished run found there is not redone")
  parser.add_argument("--probe", default="stall_medium", choices=sorted(OUTS))
  parser.add_argument("--out", default=None, help=f"default: {OUTS}")
  args = parser.parse_args(argv)
  args.out = args.out or OUTS[args.probe]
  models = quality_small.names(args.models, stall_medium.VARIANTS, "models")
  changes = _recipes(args.changes)
  runs = {}
  if os.path.exists(args.out):
    with open(args.out) as f:
      runs = {(r["corpus"], r["variant"], r["seed"]): r for r in json.load(f)["runs"]}
  machine = machine_info()
  recorded = lambda: {"machine": machine, "args": vars(args),  # noqa: E731
                      "summary": summarise(list(runs.values())),
                      "paired": paired(list(runs.values())),
                      "alarms": alarms(list(runs.values())), "runs": list(runs.values())}
  todo = [(args.corpus, f"{m}/{c}", s) for m in models for c in changes
          for s in parse_seeds(args.seeds) if (args.corpus, f"{m}/{c}", s) not in runs]
  if args.jobs > 1 and todo:
    quality_small.prepare_corpora(args.probe, [args.corpus], args.workdir)
  calls = [(args.probe, *key, args.workdir) for key in todo]
  for (_, corpus, variant, seed, _), result in quality_small.in_processes(train_one, calls,
                                                                           args.jobs):
    runs[corpus, variant, seed] = result
    print(f"{corpus} {variant} seed {seed}: stalled at {result['stalled_at']}", flush=True)
    write_result(recorded(), args.out)
  result = recorded()
  steps = quality_small.variant_config(args.probe, "dense/baseline").train.steps
  print(format_table(result["summary"], steps))
  print(format_paired(result["paired"]))
  print(f"stall warning against the criterion over {result['alarms']['runs']} runs: false "
        f"alarms {result['alarms']['false']}, missed {result['alarms']['missed']}")
  return result


def _recipes(text: str) -> list[str]:
  """`--changes` checked against the probe's: each recipe one change or several joined by
  '+'."""
  recipes = [r for r in text.split(",") if r]
  try:
    for recipe in recipes:
      stall_medium.recipe_overrides(recipe)
  except ValueError as e:
    raise SystemExit(f"--changes: {e}") from None
  if not recipes:
    raise SystemExit(f"--changes must name some of {list(stall_medium.CHANGES)}; got {text!r}")
  return recipes


if __name__ == "__main__":
  main()
