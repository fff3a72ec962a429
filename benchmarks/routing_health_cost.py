"""What live routing health costs: the embedded default's training step with and without it.

    python -m benchmarks.routing_health_cost [--rounds=40] [--preset=default] \
        [--out=benchmarks/routing_health_cost_cpu.json]

`sparse_jax/configs/default.py` (what `python train.py` trains: a 4-layer sigma-MoE LM, 8 experts, K=2,
batch 16 x 128 tokens) on one device, fed random tokens. Two jitted training steps from the
same initial state: `on`, the task's loss as `train.py` runs it (each MoE layer's token shares
leave the step as metrics, `sparse_jax.training.routing_health`), and `off`, the same loss
with the `routing/` metrics stripped, so XLA drops their computation: the step as it was
before routing health. After one compiling call each, the two take turns step by step in
ABBA order (`--rounds` pairs), so drift in the machine's load hits both alike. Also timed: the
host side once per log, `MetricsWindow.flush` of `train.log_every` steps' metrics plus
`RoutingHealth`, with and without the routing metrics. Prints a table (median ms, the
overhead of `on` over `off`, per step and amortised per log) and writes JSON.
"""

import argparse
import statistics
import time

import jax
import numpy as np

from benchmarks.lm_train_step import LMTrainStep, abba_step_times
from benchmarks.machine import machine_info, write_result
from sparse_jax.configs import default
from sparse_jax import parallel
from sparse_jax.tasks.lm import LanguageModelTask
from sparse_jax.training.loop import MetricsWindow
from sparse_jax.training.routing_health import PREFIX, RoutingHealth


def bench_config(preset: str):
  """The embedded default, or a toy of it (`tiny`, for the smoke test)."""
  config = default.get_config()
  config.mesh.data = 1
  if preset == "tiny":
    config.data.update(batch_size=2, seq_len=8)
    config.model.update(d_model=16, n_layers=2, n_heads=2, mem_len=8)
    config.model.ff.update(n_experts=4, expert_size=8)
    config.train.log_every = 3
  return config


def without_routing(loss_fn):
  """`loss_fn` with the routing health metrics removed from its metrics (the `off` step)."""

  def loss(model, batch, carry):
    value, (metrics, new_carry) = loss_fn(model, batch, carry)
    return value, ({k: v for k, v in metrics.items() if not k.startswith(PREFIX)}, new_carry)

  return loss


def host_seconds_per_log(metrics: dict, log_every: int, repeats: int) -> float:
  """Median seconds of flushing a window of `log_every` steps' `metrics` (device arrays)
  and deriving the routing health from it, as `Run.log` does once per log."""
  seconds = []
  for _ in range(repeats):
    window = MetricsWindow(0)
    window.metrics = [metrics] * log_every
    start = time.perf_counter()
    RoutingHealth(warn=False)(log_every, window.flush(1, "rate"))
    seconds.append(time.perf_counter() - start)
  return statistics.median(seconds)


def summarise(times: dict, host: dict, log_every: int) -> dict:
  """Median step ms of each variant, the median paired ratio, and the overheads."""
  step_ms = {name: 1e3 * statistics.median(t) for name, t in times.items()}
  ratio = statistics.median(a / b for a, b in zip(times["on"], times["off"]))
  host_extra_ms = 1e3 * (host["on"] - host["off"])
  return {"step_ms": step_ms, "host_ms_per_log": {k: 1e3 * v for k, v in host.items()},
          "median_paired_ratio": ratio,
          "step_overhead_percent": 100 * (step_ms["on"] / step_ms["off"] - 1),
          "paired_overhead_percent": 100 * (ratio - 1),
          "total_overhead_percent": 100 * (step_ms["on"] + host_extra_ms / log_every
                                           - step_ms["off"]) / step_ms["off"]}


def print_table(config, summary: dict, rounds: int) -> None:
  print(f"\n### Routing health cost (batch {config.data.batch_size} x {config.data.seq_len}, "
        f"{config.model.n_layers} MoE layers, median of {rounds} ABBA-interleaved steps)\n")
  print("| variant | step ms | host ms per log |")
  print("|---|---:|---:|")
  for name in ("off", "on"):
    print(f"| {name} | {summary['step_ms'][name]:.1f} "
          f"| {summary['host_ms_per_log'][name]:.2f} |")
  print(f"\noverhead of `on`: {summary['step_overhead_percent']:+.2f}% (medians), "
        f"{summary['paired_overhead_percent']:+.2f}% (median paired ratio), "
        f"{summary['total_overhead_percent']:+.2f}% with the host side amortised over "
        f"log_every={config.train.log_every}")


def main(argv=None) -> dict:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--preset", choices=("default", "tiny"), default="default")
  parser.add_argument("--rounds", type=int, default=40)
  parser.add_argument("--host_repeats", type=int, default=20)
  parser.add_argument("--out", default="benchmarks/routing_health_cost_cpu.json")
  args = parser.parse_args(argv)
  machine = machine_info()
  config = bench_config(args.preset)
  task = LanguageModelTask(config)
  mesh = parallel.make_mesh([1, 1, 1])
  with jax.set_mesh(mesh):
    runs = {"on": LMTrainStep(config, mesh),
            "off": LMTrainStep(config, mesh, loss_fn=without_routing(task.loss))}
    rng = np.random.default_rng(0)
    batches = [runs["on"].random_batch(rng) for _ in range(4)]
    times = abba_step_times(runs, batches, args.rounds)
    metrics = {name: run(batches[0], args.rounds + 1) for name, run in runs.items()}
  log_every = config.train.log_every
  host = {name: host_seconds_per_log(m, log_every, args.host_repeats)
          for name, m in metrics.items()}
  summary = summarise(times, host, log_every)
  print_table(config, summary, args.rounds)
  result = {"machine": machine, **vars(args), "log_every": log_every,
            "routing_metrics": sorted(k for k in metrics["on"] if k.startswith(PREFIX)),
            **summary, "step_seconds": times}
  write_result(result, args.out)
  return result


if __name__ == "__main__":
  main()
