"""The paper's comparison at small scale: same-size FF approximations trained alike, over seeds
and corpora.

    python -m benchmarks.quality_small [--seeds=0,1,2] [--corpora=builtin,prose] [--steps=1000]
    python -m benchmarks.quality_small --config=quality_medium --seeds=0,1,2 --corpora=builtin,prose
    python -m benchmarks.quality_small --config=wt103_s_embedded --corpora=builtin --jobs=2  # GPU

Trains `sparse_jax/configs/quality_small.py` once per variant (parameter-matched dense, sigma-MoE,
Switch, S-BASE, PKM-relu, PKM-softmax, Top-K), `sparse_jax/configs/quality_medium.py` (dense and
sigma-MoE with the paper's expert shape) or `sparse_jax/configs/wt103_s_embedded.py` (the paper's WT-103 S
pair itself, bfloat16: for a GPU), per seed (initialisation, dropout and routing
noise) and corpus: `builtin` (Python sources) and `prose` (Vim's documentation,
`benchmarks/prose_corpus.py`). Each run lives in
`WORKDIR/<config>/<corpus id>/<variant>/seed<N>` (the id names the corpus's version:
`builtin`, `prose_v2`) and leaves its result there as `result.json`: a finished run is read
back, not redone, and an interrupted one resumes from its checkpoint (its `wall_s` then covers
the last invocation, which started after `resumed_after_step`; `run_s` is the whole run's
time over all invocations, from its `metrics.jsonl`: `training.metrics_log.logged_seconds`).
The JSON (`--out`) is rewritten after every finished run and keeps every run it has
recorded, also those of earlier invocations: a run recorded there is not redone either, so a
committed JSON carries finished runs to a fresh checkout whose `runs/` is empty; runs on an
earlier version of a corpus are dropped from it. Prints per corpus a table of validation
bits per byte as mean +- standard deviation over the seeds, and each variant's difference to
dense (paired by seed, in percent of dense) with its spread.
"""

import argparse
import ast
import concurrent.futures
import json
import multiprocessing
import os
import re
import statistics
import time

from benchmarks import prose_corpus
from benchmarks.machine import machine_info, write_result
from sparse_jax.configs import (default, default_dense, quality_medium, quality_small,
                                stall_medium, wt103_s_embedded)
from sparse_jax.data.datasets import prepared_builder
from sparse_jax.models.accounting import model_report
from sparse_jax.tasks.runs import train_to_completion
from sparse_jax.tasks.selection import validate_config
from sparse_jax.training.resume_config import flat_config
from sparse_jax.training.metrics_log import (METRICS_FILE, latest_records, logged_seconds,
                                             read_metrics)

# Every variant has the dense FF's 132k parameters per layer (within 1.2%, PKM), in the form
# the sigma-MoE authors ran it (docs/sigma_moe.md "Feed-forward kinds"): Switch with G = K*G,
# N_E / K experts, no capacity limit; S-BASE per sequence; PKM with knn >= sub-keys (dense path).
SMALL_VARIANTS = {
    "dense": {"kind": "dense", "d_ff": 514},
    "sigma_moe": {"kind": "sigma_moe", "n_experts": 8, "expert_size": 64, "k": 2,
                  "expert_dropout": 0.05, "reg_coef": 0.0001},
    "switch": {"kind": "switch", "n_experts": 4, "expert_size": 128, "reg_coef": 0.01},
    "sbase": {"kind": "sbase", "n_experts": 8, "expert_size": 64, "k": 2,
              "expert_dropout": 0.05, "reg_coef": 0.0001},
    "pkm_relu": {"kind": "pkm", "n_subkeys": 30, "knn": 128, "activation": "relu"},
    "pkm_softmax": {"kind": "pkm", "n_subkeys": 30, "knn": 128, "activation": "softmax"},
    "topk": {"kind": "topk", "d_ff": 514, "k": 128},
}
# One change a run here; stall_medium's recipes also join changes with `+`.
_RECIPE_VARIANTS = tuple(f"{model}/{change}" for model in stall_medium.VARIANTS
                         for change in stall_medium.CHANGES)
CONFIGS = {"quality_small": tuple(SMALL_VARIANTS), "quality_medium": quality_medium.VARIANTS,
           "wt103_s_embedded": wt103_s_embedded.VARIANTS, "stall_medium": _RECIPE_VARIANTS,
           # `python train.py`'s run (or its dense twin's) under stall_medium's recipes.
           "default": _RECIPE_VARIANTS}
CORPORA = ("builtin", "prose")
# What each corpus's runs record as `corpus_id`; runs recorded on another id are superseded.
CORPUS_IDS = {"builtin": "builtin", "prose": prose_corpus.CORPUS_ID}
RESULT_FILE = "result.json"
# Where a run's data lie: not part of what a recorded run must match (`recorded_config`).
_DATA_LOCATIONS = re.compile(r"data\.(\w+_(file|dir)|source_root)$")


def variant_config(config_name: str, variant: str, overrides: dict | None = None):
  """The config of one variant, with `overrides` (`{"model.embed_init": "normal"}`) set."""
  if config_name == "quality_medium":
    config = quality_medium.get_config(variant)
  elif config_name == "stall_medium":
    config = stall_medium.get_config(variant)
  elif config_name == "default":
    model, _, recipe = variant.partition("/")
    config = default.get_config() if model == "sigma_moe" else default_dense.get_config()
    stall_medium.apply_recipe(config, recipe)
  elif config_name == "wt103_s_embedded":
    config = wt103_s_embedded.get_config(variant)
  else:
    config = quality_small.get_config()
    config.model.ff = SMALL_VARIANTS[variant]
  config.update_from_flattened_dict(overrides or {})
  return config


def parse_overrides(pairs: list[str]) -> dict:
  """`["model.embed_init=normal", "train.lr=5e-4"]` as `{path: value}` (Python literals
  where they parse, else strings)."""
  overrides = {}
  for pair in pairs:
    path, equals, text = pair.partition("=")
    if not equals or not path:
      raise SystemExit(f"--set takes PATH=VALUE (model.embed_init=normal); got {pair!r}")
    try:
      overrides[path] = ast.literal_eval(text)
    except (ValueError, SyntaxError):
      overrides[path] = text
  return overrides


def recorded_config(config) -> dict:
  """The run's config with every default filled in (`validate_config`), as flat
  `{path: value}` in JSON's types, less where its data lie: what a recorded run must match to
  be reused, whatever the config file or the library's defaults say by then."""
  flat = flat_config(validate_config(config).to_dict())
  return {path: value for path, value in flat.items() if not _DATA_LOCATIONS.match(path)}


def check_same_config(recorded: dict, config: dict, what: str, where: str) -> None:
  """Refuses a recorded run whose config (`recorded["config_fields"]`) differs from `config`
  in a field it records: it trained something else."""
  absent = "<absent>"
  changed = {path: (value, config.get(path, absent))
             for path, value in recorded.get("config_fields", {}).items()
             if config.get(path, absent) != value}
  if changed:
    listed = ", ".join(f"{path} {old!r} (now {new!r})" for path, (old, new) in changed.items())
    raise SystemExit(f"{what} is recorded in {where} with {listed}: name another {where}, "
                     f"or --set the recorded values")


def step_seconds(records: list[dict], tokens_per_step: int) -> float:
  """Median training step time from a run's logged tokens per second (`records`: its
  `metrics.jsonl`, `read_metrics`)."""
  rates = sorted(r["tokens_per_second"] for r in latest_records(records, "train"))
  return tokens_per_step / rates[len(rates) // 2]


def logged_steps(workdir: str) -> int:
  """The last training step an earlier, interrupted invocation logged (0 for a fresh run)."""
  if not os.path.exists(os.path.join(workdir, METRICS_FILE)):
    return 0
  return max((r["step"] for r in latest_records(read_metrics(workdir), "train")), default=0)


def recorded_runs(out: str, config_name: str) -> dict:
  """The runs an earlier invocation recorded in the JSON at `out`, by (corpus, variant, seed);
  none from a JSON of the benchmark's first format (a `rows` table, no `runs`), which is
  replaced as before."""
  if not os.path.exists(out):
    return {}
  with open(out) as f:
    runs = json.load(f).get("runs", [])
  others = sorted({r["config"] for r in runs} - {config_name})
  if others:
    raise SystemExit(f"--out={out} records runs of {others}, not {config_name!r}: name "
                     "another --out")
  current = [r for r in runs if r.get("corpus_id", r["corpus"]) == CORPUS_IDS[r["corpus"]]]
  if len(current) < len(runs):
    print(f"{out}: dropping {len(runs) - len(current)} runs on a superseded corpus version "
          f"(now {sorted(set(CORPUS_IDS.values()))})", flush=True)
  return {(r["corpus"], r["variant"], r["seed"]): r for r in current}


def read_corpus(config, corpus: str, root: str) -> None:
  """Points `config.data` at `corpus` (`prose`: the split files `prose_corpus.prepare` writes
  under `root`, whether or not it has yet)."""
  if corpus == "prose":
    config.data.update(prose_corpus.data_overrides(prose_corpus.split_paths(root)))


def run_folder(root: str, config_name: str, corpus: str, variant: str, seed: int,
               overrides: dict | None = None) -> str:
  """Where `run` trains a (config, corpus, variant, seed) and leaves its result; runs with
  `overrides` (--set) in a folder of their own beside the variant's (`dense+train.lr=0.0005`)."""
  variant += "".join(f"+{path}={value}" for path, value in sorted((overrides or {}).items()))
  return os.path.join(root, config_name, CORPUS_IDS[corpus], variant, f"seed{seed}")


def run(config_name: str, corpus: str, variant: str, seed: int, steps: int | None,
        root: str, recorded: dict | None = None, overrides: dict | None = None) -> dict:
  """One training run, or its result when it has finished before: saved in its run folder
  or recorded in `recorded` (runs by corpus, variant and seed) with the same number of
  steps and the same config (`check_same_config`)."""
  config = variant_config(config_name, variant, overrides)
  config.seed = seed
  if steps is not None:
    config.train.update(steps=steps, eval_every=min(config.train.eval_every, steps),
                        ckpt_every=min(config.train.ckpt_every, steps))
  read_corpus(config, corpus, root)
  trained = recorded_config(config)
  what = f"{config_name} {corpus} {variant} seed {seed}"
  earlier = (recorded or {}).get((corpus, variant, seed))
  if earlier is not None:
    if earlier["steps"] != config.train.steps:
      raise SystemExit(f"{what} is recorded with {earlier['steps']} steps, not "
                       f"{config.train.steps}: name another --out")
    check_same_config(earlier, trained, what, "--out")
    return earlier
  workdir = run_folder(root, config_name, corpus, variant, seed, overrides)
  result_path = os.path.join(workdir, RESULT_FILE)
  if os.path.exists(result_path):
    with open(result_path) as f:
      finished = json.load(f)
    check_same_config(finished, trained, what, "--workdir")
    return finished
  if corpus == "prose":
    prose_corpus.prepare(root)
  resumed_from = logged_steps(workdir)
  started = time.perf_counter()
  final = train_to_completion(config, workdir)
  report = model_report(config.model)
  tokens_per_step = config.data.batch_size * config.data.seq_len
  records = read_metrics(workdir)
  result = {"config": config_name, "corpus": corpus, "corpus_id": CORPUS_IDS[corpus],
            "variant": variant, "seed": seed, "config_fields": trained,
            "steps": config.train.steps, "valid_bits_per_byte": final["bits_per_byte"],
            "copy_ratio": final.get("copy_ratio"),
            "params": report["total_params"],
            "ff_flops_percent": report["ff_flops_percent_of_dense"],
            "step_ms": 1000 * step_seconds(records, tokens_per_step),
            "wall_s": time.perf_counter() - started, "resumed_after_step": resumed_from,
            "run_s": logged_seconds(records, tokens_per_step)["total"]}
  with open(result_path, "w") as f:
    json.dump(result, f, indent=2)
  return result


def prepare_corpora(config_name: str, corpora: list[str], root: str,
                    data_dir: str | None = None) -> None:
  """Prepares each corpus's dataset once (into TFDS's `data_dir`; None: its default), before
  runs in parallel processes read it: two processes preparing one TFDS dataset collide."""
  for corpus in corpora:
    config = variant_config(config_name, CONFIGS[config_name][0])
    config.data.data_dir = data_dir
    if corpus == "prose":
      prose_corpus.prepare(root)
    read_corpus(config, corpus, root)
    prepared_builder(config.data)


def in_processes(function, calls: list[tuple], jobs: int):
  """`(call, function(*call))` for each of `calls` as it finishes: in this process with `jobs`
  1, else in `jobs` processes at a time (spawned: JAX in a forked child can deadlock). A
  failed call raises once the calls already running have finished."""
  if jobs == 1:
    for call in calls:
      yield call, function(*call)
    return
  context = multiprocessing.get_context("spawn")
  with concurrent.futures.ProcessPoolExecutor(jobs, mp_context=context) as pool:
    futures = {pool.submit(function, *call): call for call in calls}
    for future in concurrent.futures.as_completed(futures):
      yield futures[future], future.result()


def mean_sd(values: list[float]) -> tuple[float, float | None]:
  return statistics.mean(values), statistics.stdev(values) if len(values) > 1 else None


def paired_percent(treated: dict[int, float], control: dict[int, float]) -> dict[int, float]:
  """Per seed both have (in order): `treated` minus `control` in percent of `control`, a
  comparison paired by seed."""
  return {s: 100 * (treated[s] / control[s] - 1) for s in sorted(treated.keys() & control.keys())}


def summarise(runs: list[dict]) -> list[dict]:
  """Per (corpus, variant): bits per byte mean and sd over seeds, and the difference to dense
  of the same corpus and seed, in percent of dense, mean and sd (dense itself: none)."""
  by_key = {(r["corpus"], r["variant"], r["seed"]): r for r in runs}
  rows = []
  for corpus, variant in dict.fromkeys((r["corpus"], r["variant"]) for r in runs):
    seeds = sorted(s for c, v, s in by_key if (c, v) == (corpus, variant))
    bpb = [by_key[corpus, variant, s]["valid_bits_per_byte"] for s in seeds]
    mean, sd = mean_sd(bpb)
    row = {"corpus": corpus, "variant": variant, "seeds": seeds, "bpb_mean": mean,
           "bpb_sd": sd, "diff_percent_mean": None, "diff_percent_sd": None,
           "params": by_key[corpus, variant, seeds[0]]["params"]}
    dense = {s: r["valid_bits_per_byte"] for (c, v, s), r in by_key.items()
             if (c, v) == (corpus, "dense")}
    diffs = paired_percent(dict(zip(seeds, bpb)), dense)
    if variant != "dense" and diffs:
      row["diff_percent_mean"], row["diff_percent_sd"] = mean_sd(list(diffs.values()))
    rows.append(row)
  return rows


def format_table(rows: list[dict]) -> str:
  lines = ["| corpus | variant | seeds | valid bpb (mean +- sd) | vs dense, % (mean +- sd) | "
           "params |", "|---|---|---:|---:|---:|---:|"]
  pm = lambda mean, sd, fmt: "-" if mean is None else (
      f"{mean:{fmt}}" + ("" if sd is None else f" +- {sd:{fmt.lstrip('+')}}"))
  for r in rows:
    lines.append(f"| {r['corpus']} | {r['variant']} | {len(r['seeds'])} | "
                 f"{pm(r['bpb_mean'], r['bpb_sd'], '.4f')} | "
                 f"{pm(r['diff_percent_mean'], r['diff_percent_sd'], '+.2f')} | "
                 f"{r['params']:,} |")
  return "\n".join(lines)


def names(text: str, allowed, what: str) -> list[str]:
  names = [n for n in text.split(",") if n]
  unknown = [n for n in names if n not in allowed]
  if unknown or not names:
    raise SystemExit(f"--{what} must be a comma-separated subset of {list(allowed)}; "
                     f"got {text!r}")
  return names


def main(argv=None) -> dict:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--config", default="quality_small", choices=sorted(CONFIGS))
  parser.add_argument("--variants", default=None, help="default: all of the config's")
  parser.add_argument("--seeds", default="0", help="comma-separated seeds")
  parser.add_argument("--corpora", default="builtin", help=f"comma-separated, of {CORPORA}")
  parser.add_argument("--steps", type=int, default=None, help="default: the config's")
  parser.add_argument("--set", action="append", default=[], metavar="PATH=VALUE",
                      help="a config field every run sets (repeatable), e.g. "
                           "--set=model.embed_init=normal; recorded with each run")
  parser.add_argument("--jobs", type=int, default=1, help="runs trained at a time")
  parser.add_argument("--workdir", default="runs/quality",
                      help="where runs go; a finished run found there is not redone")
  parser.add_argument("--out", default=None,
                      help="JSON path (default: benchmarks/<config>.json)")
  parser.add_argument("--stage_corpora", default=None, metavar="DIR",
                      help="only prepare --corpora in DIR (TFDS datasets in "
                           "DIR/tensorflow_datasets), to carry to a machine without them")
  args = parser.parse_args(argv)
  variants = names(args.variants or ",".join(CONFIGS[args.config]), CONFIGS[args.config],
                    "variants")
  corpora = names(args.corpora, CORPORA, "corpora")
  seeds = [int(s) for s in args.seeds.split(",") if s]
  overrides = parse_overrides(args.set)
  if args.stage_corpora:
    prepare_corpora(args.config, corpora, args.stage_corpora,
                    data_dir=os.path.join(args.stage_corpora, "tensorflow_datasets"))
    return {"staged": args.stage_corpora}
  out = args.out or f"benchmarks/{args.config}.json"
  runs = recorded_runs(out, args.config)
  machine = machine_info()
  recorded = lambda: {"machine": machine, "args": vars(args),  # noqa: E731
                      "summary": summarise(list(runs.values())), "runs": list(runs.values())}
  calls = [(args.config, corpus, variant, seed, args.steps, args.workdir, runs, overrides)
           for corpus in corpora for seed in seeds for variant in variants]
  if args.jobs > 1 and any(call[1:4] not in runs for call in calls):
    prepare_corpora(args.config, corpora, args.workdir)
  for call, finished in in_processes(run, calls, args.jobs):
    key = call[1:4]
    print(f"{args.config} {' '.join(map(str, key))}: "
          f"{finished['valid_bits_per_byte']:.4f} bits per byte", flush=True)
    if runs.get(key) != finished:
      runs[key] = finished
      write_result(recorded(), out)
  result = recorded()
  print(format_table(result["summary"]))
  return result


if __name__ == "__main__":
  main()
