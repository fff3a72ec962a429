"""The SwitchHead paper's comparison at small scale on a CPU: dense attention with many heads,
SwitchHead, and dense with SwitchHead's head count, at equal parameters, over seeds.

    python -m benchmarks.switchhead_small --seeds=0,1 --workdir=runs/switchhead_small \
        --out=benchmarks/switchhead_small.json [--steps=N] [--variants=dense,switchhead] \
        [--step_rounds=10]

Trains every variant of each comparison in `COMPARISONS` (`sparse_jax/configs/switchhead_small.py`'s
`dense`, `switchhead`, `dense_few`; `sparse_jax/configs/moeut_small.py`'s `moeut_dense`, `moeut`) once per
seed on `builtin`. Each run lives in `WORKDIR/<comparison>/<variant>/seed<N>` and leaves its
result there as `result.json`: a finished run is read back, not redone, and an interrupted one
(SIGTERM: `RunInterrupted`) resumes from its checkpoint when the command is run again (its
`wall_s` then covers the last invocation, which started after `resumed_after_step`); a finished
run recorded with another config (any field, every default filled in: `config_fields`; results
written before they recorded it are read back as they are) is refused by name. Prints one
Markdown table: per variant the validation bits per byte (the run's final evaluation) as mean
+- sd over the seeds, the paired difference to its comparison's baseline (its first variant, in
% of it), parameters, one attention layer's parameters, MACs and activation memory as the
SwitchHead paper counts them (`models.accounting.attention_report`), the training step time
measured after training with each comparison's variants side by side (`--step_rounds`
ABBA-interleaved steps on random tokens, so load on the machine hits all alike; the median of
the paired ratios to the baseline) and each run's wall time. Each run's JSON also keeps its
logged step time (the median logging window of its `metrics.jsonl`: taken while whatever else
ran). Writes every run and the summary as JSON.
"""

import argparse
import json
import os
import statistics
import time

import jax
import numpy as np

from benchmarks.lm_train_step import LMTrainStep, abba_step_times
from benchmarks.machine import machine_info, write_result
from benchmarks.quality_small import (check_same_config, logged_steps, mean_sd,
                                      recorded_config, step_seconds)
from sparse_jax.configs import moeut_small, switchhead_small
from sparse_jax import parallel
from sparse_jax.models.accounting import attention_report, model_report
from sparse_jax.models.lm_config import head_dim_of, validate_model_config
from sparse_jax.tasks.runs import train_to_completion
from sparse_jax.training.metrics_log import read_metrics

# comparison: (get_config(variant) of its config file, its variants; the first is the baseline
# the others are compared to). Adding a comparison (e.g. MoEUT vs dense) is one entry here;
# variant names are unique across comparisons.
COMPARISONS = {
    "switchhead": (switchhead_small.get_config, switchhead_small.VARIANTS),
    "moeut": (moeut_small.get_config, moeut_small.VARIANTS),
}
RESULT_FILE = "result.json"


def comparison_of(variant: str) -> str:
  return next(name for name, (_, variants) in COMPARISONS.items() if variant in variants)


def all_variants() -> tuple[str, ...]:
  return tuple(v for _, variants in COMPARISONS.values() for v in variants)


def variant_config(variant: str):
  get_config, _ = COMPARISONS[comparison_of(variant)]
  return get_config(variant)


def shape(config) -> dict:
  """The variant's attention and FF shape, for the table."""
  m = validate_model_config(config.model)
  return {"attention": m.attention, "n_heads": m.n_heads, "head_dim": head_dim_of(m),
          "attention_experts": m.attention_experts, "attention_k": m.attention_k,
          "d_model": m.d_model, "d_ff": config.model.ff.get("d_ff")}


def run(variant: str, seed: int, steps: int | None, root: str) -> dict:
  """One training run, or its saved result when it has finished before with the same config
  (`quality_small.check_same_config`)."""
  comparison = comparison_of(variant)
  workdir = os.path.join(root, comparison, variant, f"seed{seed}")
  result_path = os.path.join(workdir, RESULT_FILE)
  config = variant_config(variant)
  config.seed = seed
  if steps is not None:
    config.train.update(steps=steps, eval_every=min(config.train.eval_every, steps),
                        ckpt_every=min(config.train.ckpt_every, steps),
                        log_every=min(config.train.log_every, steps))
  trained = recorded_config(config)
  if os.path.exists(result_path):
    with open(result_path) as f:
      finished = json.load(f)
    check_same_config(finished, trained, f"{variant} seed {seed}", "--workdir")
    return finished
  resumed_from = logged_steps(workdir)
  started = time.perf_counter()
  final = train_to_completion(config, workdir)
  wall_s = time.perf_counter() - started
  attention = attention_report(config.model, config.data.seq_len)
  result = {"comparison": comparison, "variant": variant, "seed": seed,
            "steps": config.train.steps, "shape": shape(config),
            "valid_bits_per_byte": final["bits_per_byte"], "valid_loss": final["loss"],
            "params": model_report(config.model)["total_params"], **attention,
            "step_ms": 1000 * step_seconds(read_metrics(workdir), config.data.batch_size
                                           * config.data.seq_len),
            "wall_s": wall_s, "resumed_after_step": resumed_from, "config_fields": trained}
  with open(result_path, "w") as f:
    json.dump(result, f, indent=2)
  return result


def interleaved_step_ms(variants: list[str], rounds: int) -> dict[str, dict]:
  """Per variant, its training step's median ms when the variants of its comparison take
  turns step by step (ABBA order, `rounds` rounds after a compiling call each, random tokens,
  one device), and the median over rounds of its baseline's step over its own: step times
  measured side by side, so the machine's load hits all alike (the runs' logged step times
  are not: they ran at different times)."""
  mesh = parallel.make_mesh([1, 1, 1])
  timed = {}
  for comparison, (_, comparison_variants) in COMPARISONS.items():
    chosen = [v for v in comparison_variants if v in variants]
    if not chosen:
      continue
    configs = {v: variant_config(v) for v in chosen}
    for config in configs.values():
      config.mesh.data = 1
    with jax.set_mesh(mesh):
      steps = {v: LMTrainStep(c, mesh) for v, c in configs.items()}
      rng = np.random.default_rng(0)
      batches = [steps[chosen[0]].random_batch(rng) for _ in range(4)]
      times = abba_step_times(steps, batches, rounds)
    baseline = comparison_variants[0]
    for v in chosen:
      ratio = (statistics.median(b / t for b, t in zip(times[baseline], times[v]))
               if baseline in times else None)
      timed[v] = {"step_ms": 1e3 * statistics.median(times[v]), "x_baseline": ratio,
                  "rounds": rounds}
  return timed


def summarise(runs: list[dict], timed: dict[str, dict]) -> list[dict]:
  """Per variant (in the order of the runs): bits per byte mean and sd over seeds, the
  difference to its comparison's baseline of the same seed in % of it (mean and sd; the
  baseline itself: none), its sizes and costs, its step time side by side with its
  comparison's other variants (`timed`, from `interleaved_step_ms`; None when not timed),
  and each run's wall time."""
  by_key = {(r["variant"], r["seed"]): r for r in runs}
  rows = []
  for variant in dict.fromkeys(r["variant"] for r in runs):
    seeds = sorted(s for v, s in by_key if v == variant)
    mine = [by_key[variant, s] for s in seeds]
    mean, sd = mean_sd([r["valid_bits_per_byte"] for r in mine])
    baseline = COMPARISONS[comparison_of(variant)][1][0]
    row = {"comparison": mine[0]["comparison"], "variant": variant, "baseline": baseline,
           "seeds": seeds, "shape": mine[0]["shape"], "bpb_mean": mean, "bpb_sd": sd,
           "diff_percent_mean": None, "diff_percent_sd": None, "params": mine[0]["params"],
           **{key: mine[0][key] for key in ("attention_params_per_layer",
                                            "attention_macs_per_layer",
                                            "attention_memory_floats_per_layer")},
           "step": timed.get(variant), "wall_s": [r["wall_s"] for r in mine]}
    paired = [s for s in seeds if (baseline, s) in by_key]
    if variant != baseline and paired:
      diffs = [100 * (by_key[variant, s]["valid_bits_per_byte"]
                      / by_key[baseline, s]["valid_bits_per_byte"] - 1) for s in paired]
      row["diff_percent_mean"], row["diff_percent_sd"] = mean_sd(diffs)
    rows.append(row)
  return rows


def _shape_text(s: dict) -> str:
  experts = (f", E {s['attention_experts']} K {s['attention_k']}"
             if s["attention_experts"] else "")
  ff = "" if s["d_ff"] is None else f", d_ff {s['d_ff']}"
  return f"{s['n_heads']} x {s['head_dim']}{experts}{ff}"


def step_text(step: dict | None) -> str:
  if step is None:
    return "- | -"
  ratio = "-" if step["x_baseline"] is None else f"{step['x_baseline']:.2f}"
  return f"{step['step_ms']:.0f} | {ratio}"


def format_table(rows: list[dict]) -> str:
  lines = ["| variant | heads x Dh | seeds | valid bpb (mean +- sd) | vs baseline, % | params | "
           "attn params / layer | attn MACs / layer | attn memory / layer (floats) | "
           "step ms (side by side) | x baseline speed | wall s per run |",
           "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
  pm = lambda mean, sd, fmt: "-" if mean is None else (
      f"{mean:{fmt}}" + ("" if sd is None else f" +- {sd:{fmt.lstrip('+')}}"))
  for r in rows:
    lines.append(
        f"| {r['variant']} | {_shape_text(r['shape'])} | {len(r['seeds'])} | "
        f"{pm(r['bpb_mean'], r['bpb_sd'], '.4f')} | "
        f"{pm(r['diff_percent_mean'], r['diff_percent_sd'], '+.2f')} | {r['params']:,} | "
        f"{r['attention_params_per_layer']:,} | "
        f"{r['attention_macs_per_layer'] / 1e6:.1f}M | "
        f"{r['attention_memory_floats_per_layer'] / 1e6:.2f}M | "
        f"{step_text(r['step'])} | {', '.join(f'{w:.0f}' for w in r['wall_s'])} |")
  return "\n".join(lines)


def main(argv=None) -> dict:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--variants", default=",".join(all_variants()),
                      help=f"comma-separated, of {all_variants()} (default: all)")
  parser.add_argument("--seeds", default="0,1", help="comma-separated seeds")
  parser.add_argument("--steps", type=int, default=None, help="default: the config's")
  parser.add_argument("--workdir", default="runs/switchhead_small",
                      help="where runs go; a finished run found there is not redone")
  parser.add_argument("--out", default="benchmarks/switchhead_small.json", help="JSON path")
  parser.add_argument("--step_rounds", type=int, default=10,
                      help="rounds of the side-by-side step timing after training (0: none)")
  args = parser.parse_args(argv)
  variants = [v for v in args.variants.split(",") if v]
  if not variants or set(variants) - set(all_variants()):
    raise SystemExit(f"--variants must be a comma-separated subset of {list(all_variants())}; "
                     f"got {args.variants!r}")
  seeds = [int(s) for s in args.seeds.split(",") if s]
  machine = machine_info()
  runs = []
  for seed in seeds:
    for variant in variants:
      print(f"switchhead_small {variant} seed {seed}", flush=True)
      runs.append(run(variant, seed, args.steps, args.workdir))
  timed = interleaved_step_ms(variants, args.step_rounds) if args.step_rounds > 0 else {}
  rows = summarise(runs, timed)
  print(format_table(rows))
  result = {"machine": machine, "args": vars(args), "summary": rows, "runs": runs}
  write_result(result, args.out)
  return result


if __name__ == "__main__":
  main()
