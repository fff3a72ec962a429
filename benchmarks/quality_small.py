"""The paper's comparison at small scale: same-size FF approximations trained alike.

    python -m benchmarks.quality_small [--steps=1000] [--out=benchmarks/quality_small.json]

Trains `configs/quality_small.py` once per variant (parameter-matched dense, sigma-MoE,
Switch, S-BASE, PKM-relu, PKM-softmax, Top-K) on `builtin` for the same number of steps,
then prints one table (validation bits per byte, parameters, % of the dense FF FLOPs, step
time) and writes it as JSON.
"""

import argparse
import json
import os
import platform
import tempfile
import time

import jax

from configs import quality_small
from sparse_jax.models.accounting import model_report
from sparse_jax.tasks import train_and_evaluate

# Every variant has the dense FF's 132k parameters per layer (within 1.2%, PKM), in the form
# the sigma-MoE authors ran it (docs/sigma_moe.md "Feed-forward kinds"): Switch with G = K*G, N_E / K
# experts, no capacity limit; S-BASE per sequence; PKM with knn >= sub-keys (dense path).
VARIANTS = {
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


def step_seconds(workdir: str, tokens_per_step: int) -> float:
  """Median training step time from the run's logged tokens per second."""
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    rates = sorted(r["tokens_per_second"] for r in map(json.loads, f) if r["split"] == "train")
  return tokens_per_step / rates[len(rates) // 2]


def run_variant(name: str, steps: int, root: str) -> dict:
  config = quality_small.get_config()
  config.model.ff = VARIANTS[name]
  config.train.update(steps=steps, warmup_steps=min(100, steps // 10), eval_every=steps,
                      ckpt_every=steps)
  workdir = os.path.join(root, name)
  started = time.perf_counter()
  final = train_and_evaluate(config, workdir)
  report = model_report(config.model)
  tokens = config.data.batch_size * config.data.seq_len
  return {"variant": name, "valid_bits_per_byte": final["bits_per_byte"],
          "params": report["total_params"],
          "ff_flops_percent": report["ff_flops_percent_of_dense"],
          "step_ms": 1000 * step_seconds(workdir, tokens),
          "wall_s": time.perf_counter() - started}


def print_table(rows: list[dict]) -> None:
  print(f"{'variant':<12} {'valid bpb':>9} {'params':>10} {'% FF FLOPs':>10} {'step ms':>8}")
  for r in rows:
    print(f"{r['variant']:<12} {r['valid_bits_per_byte']:>9.4f} {r['params']:>10,d} "
          f"{r['ff_flops_percent']:>10.1f} {r['step_ms']:>8.1f}")


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--steps", type=int, default=1000)
  parser.add_argument("--variants", default=",".join(VARIANTS))
  parser.add_argument("--out", default="benchmarks/quality_small.json")
  parser.add_argument("--workdir", default=None, help="Where runs go (default: a temp dir).")
  args = parser.parse_args()
  root = args.workdir or tempfile.mkdtemp(prefix="quality_small_")
  rows = [run_variant(name, args.steps, root) for name in args.variants.split(",")]
  print_table(rows)
  result = {"machine": f"{platform.processor() or platform.machine()}, "
                       f"{os.cpu_count()} cores, {jax.default_backend()}",
            "jax": jax.__version__, "steps": args.steps, "rows": rows}
  with open(args.out, "w") as f:
    json.dump(result, f, indent=2)
  print(f"wrote {args.out}")


if __name__ == "__main__":
  main()
