"""bfloat16 vs float32 training of the embedded default: step time and the loss curves.

    python -m benchmarks.mixed_precision [--steps=300] [--out=benchmarks/mixed_precision_cpu.json]

Trains `sparse_jax/configs/default.py` (`python train.py`'s sigma-MoE) twice in one run, with
`model.dtype` float32 and bfloat16, from the same seed on the same data, and compares: the
median training step time (from the logged tokens per second, the first logging window,
which compiles, left out) and the training loss at every logged step (the difference of the
two curves: largest and mean, and the final loss of each). Prints a table and writes JSON.
On a CPU, bfloat16 matmuls are not faster (no bf16 units on most CPUs; XLA may convert), so
the step time here says what CPU users pay; the loss curves say what bfloat16 costs in
quality on any machine.
"""

import argparse
import json
import os
import statistics
import tempfile

from benchmarks.machine import machine_info
from sparse_jax.configs import default
from sparse_jax.tasks.runs import train_to_completion
from sparse_jax.training.metrics_log import latest_records, read_metrics

DTYPES = ("float32", "bfloat16")


def train(dtype: str, steps: int, log_every: int, workdir: str) -> dict:
  """Trains the default config in `dtype`; returns its logged training curve."""
  config = default.get_config()
  config.model.dtype = dtype
  config.train.update(steps=steps, log_every=log_every, eval_every=steps, ckpt_every=steps)
  final = train_to_completion(config, workdir)
  train_lines = latest_records(read_metrics(workdir), "train")
  tokens_per_step = config.data.batch_size * config.data.seq_len
  step_seconds = [tokens_per_step / x["tokens_per_second"] for x in train_lines[1:]]
  return {"dtype": dtype, "loss": {x["step"]: x["loss"] for x in train_lines},
          "median_step_s": statistics.median(step_seconds),
          "final_validation": final.get("bits_per_byte")}


def compare(runs: dict[str, dict]) -> dict:
  """The bfloat16 curve against the float32 one at every logged step."""
  f32, bf16 = runs["float32"]["loss"], runs["bfloat16"]["loss"]
  diffs = [abs(bf16[s] - f32[s]) for s in sorted(f32)]
  last = sorted(f32)[-5:]
  return {"max_abs_loss_diff": max(diffs), "mean_abs_loss_diff": statistics.mean(diffs),
          "final_loss": {d: statistics.mean(runs[d]["loss"][s] for s in last) for d in runs},
          "step_time_ratio_bf16_over_f32": (runs["bfloat16"]["median_step_s"]
                                            / runs["float32"]["median_step_s"])}


def print_table(runs: dict[str, dict], summary: dict) -> None:
  print(f"{'dtype':<10} {'median step (s)':>16} {'final loss (last 5 logs)':>26} "
        f"{'validation bits/byte':>21}")
  for dtype, run in runs.items():
    print(f"{dtype:<10} {run['median_step_s']:>16.3f} {summary['final_loss'][dtype]:>26.4f} "
          f"{run['final_validation']:>21.4f}")
  print(f"bf16/f32 step time {summary['step_time_ratio_bf16_over_f32']:.2f}x; training loss "
        f"difference: max {summary['max_abs_loss_diff']:.4f}, "
        f"mean {summary['mean_abs_loss_diff']:.4f} nats")


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--steps", type=int, default=300)
  parser.add_argument("--log_every", type=int, default=10)
  parser.add_argument("--out", default="benchmarks/mixed_precision_cpu.json")
  args = parser.parse_args()
  with tempfile.TemporaryDirectory() as tmp:
    runs = {d: train(d, args.steps, args.log_every, os.path.join(tmp, d)) for d in DTYPES}
  summary = compare(runs)
  print_table(runs, summary)
  result = {"machine": machine_info(), "steps": args.steps, "summary": summary, "runs": runs}
  with open(args.out, "w", encoding="utf-8") as f:
    json.dump(result, f, indent=1)
  print(f"wrote {args.out}")


if __name__ == "__main__":
  main()
