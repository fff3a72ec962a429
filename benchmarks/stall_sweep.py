"""How often a training recipe stalls: `configs/stall_small.py`'s variants over many seeds.

    python -m benchmarks.stall_sweep --variants=baseline,xavier --seeds=0-11 --jobs=2

Trains each (variant, seed) of `configs/stall_small.py` on `builtin` through
`benchmarks.quality_small.run` (a finished run is read back, an interrupted one resumes; runs
live in `WORKDIR/stall_small/builtin/<variant>/seed<N>`), `--jobs` runs at a time. A run
*stalled* when the training's own stall rule fired (`copy_stalled` on a validation line of its
`metrics.jsonl`: `sparse_jax.tasks.copy_score.StallRule`, the rule users see as a warning).
Prints per variant the stalled seeds, the stall rate and the final validation bits per byte
(mean +- sd over all its seeds and over those that did not stall), and writes every run with its
evaluations (step, bits per byte, copy ratio) to `--out`, rewritten as each run finishes.
"""

import argparse
import concurrent.futures
import json
import multiprocessing
import os

from benchmarks import quality_small
from benchmarks.machine import machine_info, write_result
from configs import stall_small
from sparse_jax.training.metrics_log import latest_records, read_metrics

CONFIG = "stall_small"
CORPUS = "builtin"


def run_folder(root: str, variant: str, seed: int) -> str:
  return os.path.join(root, CONFIG, quality_small.CORPUS_IDS[CORPUS], variant, f"seed{seed}")


def evaluations(workdir: str) -> list[dict]:
  """A run's validation lines: step, bits per byte, copy ratio and whether the rule fired."""
  return [{"step": r["step"], "bits_per_byte": r["bits_per_byte"],
           "copy_ratio": r.get("copy_ratio"), "copy_stalled": bool(r.get("copy_stalled"))}
          for r in latest_records(read_metrics(workdir), "validation")]


def train_one(variant: str, seed: int, root: str) -> dict:
  """One run (`quality_small.run`) with its evaluations and whether it stalled."""
  result = dict(quality_small.run(CONFIG, CORPUS, variant, seed, None, root))
  result["evaluations"] = evaluations(run_folder(root, variant, seed))
  stalls = [e["step"] for e in result["evaluations"] if e["copy_stalled"]]
  result["stalled_at"] = stalls[0] if stalls else None
  return result


def _train_all(todo: list[tuple[str, int]], root: str, jobs: int):
  """`((variant, seed), train_one(...))` for each of `todo` as it finishes: in this process
  with `jobs` 1, else in `jobs` processes at a time."""
  if jobs == 1:
    for variant, seed in todo:
      yield (variant, seed), train_one(variant, seed, root)
    return
  context = multiprocessing.get_context("spawn")  # JAX in a forked child can deadlock.
  with concurrent.futures.ProcessPoolExecutor(jobs, mp_context=context) as pool:
    futures = {pool.submit(train_one, v, s, root): (v, s) for v, s in todo}
    for future in concurrent.futures.as_completed(futures):
      yield futures[future], future.result()


def _mean_sd(values: list[float]) -> str:
  if not values:
    return "-"
  mean, sd = quality_small.mean_sd(values)
  return f"{mean:.3f}" + ("" if sd is None else f" +- {sd:.3f}")


def summarise(runs: list[dict]) -> list[dict]:
  """Per variant: its seeds, the stalled ones and the final bits per byte of each run."""
  rows = []
  for variant in dict.fromkeys(r["variant"] for r in runs):
    mine = sorted((r for r in runs if r["variant"] == variant), key=lambda r: r["seed"])
    rows.append({"variant": variant, "seeds": [r["seed"] for r in mine],
                 "stalled_seeds": [r["seed"] for r in mine if r["stalled_at"] is not None],
                 "bpb": [r["valid_bits_per_byte"] for r in mine],
                 "bpb_not_stalled": [r["valid_bits_per_byte"] for r in mine
                                     if r["stalled_at"] is None],
                 "final_copy_ratio": [r["copy_ratio"] for r in mine]})
  return rows


def format_table(rows: list[dict]) -> str:
  lines = ["| variant | stalled / runs | stalled seeds | final bpb, all | final bpb, not stalled "
           "| final copy ratio |", "|---|---:|---|---:|---:|---:|"]
  for r in rows:
    lines.append(f"| {r['variant']} | {len(r['stalled_seeds'])} / {len(r['seeds'])} | "
                 f"{','.join(map(str, r['stalled_seeds'])) or '-'} | {_mean_sd(r['bpb'])} | "
                 f"{_mean_sd(r['bpb_not_stalled'])} | {_mean_sd(r['final_copy_ratio'])} |")
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
  parser.add_argument("--variants", default="baseline",
                      help=f"comma-separated, of {list(stall_small.VARIANTS)}")
  parser.add_argument("--seeds", default="0-11", help="e.g. 0-11 or 0,3,5")
  parser.add_argument("--jobs", type=int, default=1, help="runs trained at a time")
  parser.add_argument("--workdir", default="runs/quality",
                      help="where runs go; a finished run found there is not redone")
  parser.add_argument("--out", default="benchmarks/stall_sweep.json")
  args = parser.parse_args(argv)
  variants = quality_small.names(args.variants, stall_small.VARIANTS, "variants")
  seeds = parse_seeds(args.seeds)
  runs = {}
  if os.path.exists(args.out):
    with open(args.out) as f:
      runs = {(r["variant"], r["seed"]): r for r in json.load(f)["runs"]}
  machine = machine_info()
  recorded = lambda: {"machine": machine, "args": vars(args),  # noqa: E731
                      "summary": summarise(list(runs.values())), "runs": list(runs.values())}
  todo = [(v, s) for v in variants for s in seeds if (v, s) not in runs]
  for (variant, seed), result in _train_all(todo, args.workdir, args.jobs):
    runs[variant, seed] = result
    print(f"{variant} seed {seed}: stalled at {result['stalled_at']}", flush=True)
    write_result(recorded(), args.out)
  result = recorded()
  print(format_table(result["summary"]))
  return result


if __name__ == "__main__":
  main()
