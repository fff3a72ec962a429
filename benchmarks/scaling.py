"""Training step time of a sigma-MoE LM on 1, 2, 4 and 8 devices for each kind of parallelism.

    python -m benchmarks.scaling [--devices=1,2,4,8] [--out=benchmarks/scaling_cpu.json]

On a CPU machine the devices are simulated (`jax_num_cpu_devices`) and share its cores, so
this measures the plumbing (sharded state, collectives, the expert all-to-all), not a
speed-up: with 2 cores, more devices cannot run faster. For each parallelism the n devices
form the `data`, `fsdp` or `expert` axis of the mesh; the global batch stays the same. Prints
a table (median step time, tokens per second, time relative to the first device count) and
writes JSON.
"""

import argparse
import json
import os
import platform
import statistics
import time

import jax

if __name__ == "__main__":  # before any JAX operation creates the CPU backend
  jax.config.update("jax_num_cpu_devices", 8)

import numpy as np

from benchmarks.lm_train_step import LMTrainStep
from sparse_jax.configs import default
from sparse_jax import parallel

AXES = {"data": 0, "fsdp": 1, "expert": 2}


def bench_config(d_model: int, batch: int, seq_len: int):
  """The default sigma-MoE with 8 experts (so the expert axis can reach 8 devices)."""
  config = default.get_config()
  config.data.update(batch_size=batch, seq_len=seq_len)
  config.model.update(d_model=d_model, n_layers=2, n_heads=4, mem_len=seq_len)
  config.model.ff.update(n_experts=8, expert_size=d_model // 2, impl="blocked")
  return config


def time_steps(config, mesh, steps: int) -> float:
  """Median seconds of a training step on `mesh` (random tokens; compile excluded)."""
  train_step = LMTrainStep(config, mesh)
  rng = np.random.default_rng(0)
  times = []
  with jax.set_mesh(mesh):
    for i in range(steps + 1):
      batch = train_step.random_batch(rng)
      start = time.perf_counter()
      train_step(batch, i)
      times.append(time.perf_counter() - start)
  return statistics.median(times[1:])


def main(argv=None) -> dict:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--devices", default="1,2,4,8")
  parser.add_argument("--d_model", type=int, default=128)
  parser.add_argument("--batch", type=int, default=16)
  parser.add_argument("--seq_len", type=int, default=128)
  parser.add_argument("--steps", type=int, default=10)
  parser.add_argument("--out", default="benchmarks/scaling_cpu.json")
  args = parser.parse_args(argv)
  config = bench_config(args.d_model, args.batch, args.seq_len)
  tokens_per_step = args.batch * args.seq_len
  rows = []
  for axis, position in AXES.items():
    for n in map(int, args.devices.split(",")):
      shape = [1, 1, 1]
      shape[position] = n
      seconds = time_steps(config, parallel.make_mesh(shape), args.steps)
      rows.append({"parallelism": axis, "devices": n, "mesh": shape, "step_ms": 1000 * seconds,
                   "tokens_per_second": tokens_per_step / seconds})
  print(f"{'parallelism':<12} {'devices':>7} {'step ms':>9} {'tokens/s':>10} "
        f"{'time x first':>12}")
  for r in rows:
    first = next(b for b in rows if b["parallelism"] == r["parallelism"])
    r["time_vs_first"] = r["step_ms"] / first["step_ms"]
    print(f"{r['parallelism']:<12} {r['devices']:>7} {r['step_ms']:>9.1f} "
          f"{r['tokens_per_second']:>10.0f} {r['time_vs_first']:>12.2f}")
  result = {"machine": f"{platform.machine()}, {os.cpu_count()} cores, "
                       f"{jax.default_backend()} ({jax.device_count()} devices)",
            "jax": jax.__version__, **vars(args), "rows": rows}
  with open(args.out, "w") as f:
    json.dump(result, f, indent=2)
  print(f"wrote {args.out}")
  return result


if __name__ == "__main__":
  main()
