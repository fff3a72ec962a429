"""The embedded default's training step: sigma-MoE against its parameter-matched dense twin.

    python -m benchmarks.default_step [--rounds=30] [--out=benchmarks/default_step_cpu.json]

`sparse_jax/configs/default.py` (what `python train.py` trains: a 4-layer sigma-MoE LM, 8 experts of 128,
K=2, batch 16 x 128 tokens) and `sparse_jax/configs/default_dense.py` (the same model with the dense FF
of equal parameters), one device, random tokens, each from its own initial state. After one
compiling call each, the two take turns step by step in ABBA order (`--rounds` pairs), so the
machine's load hits both alike. Prints the median step of each and their ratio (the MoE's
speed-up over dense), and writes JSON. What a new user waits for per step of `train.py`.
"""

import argparse
import statistics

import jax
import numpy as np

from benchmarks.lm_train_step import LMTrainStep, abba_step_times
from benchmarks.machine import machine_info, write_result
from sparse_jax.configs import default, default_dense
from sparse_jax import parallel


def bench_configs(preset: str) -> dict:
  """The default and its dense twin, or toys of them (`tiny`, for the smoke test)."""
  configs = {"sigma_moe": default.get_config(), "dense": default_dense.get_config()}
  for config in configs.values():
    config.mesh.data = 1
    if preset == "tiny":
      config.data.update(batch_size=2, seq_len=8)
      config.model.update(d_model=16, n_layers=2, n_heads=2, mem_len=8)
  if preset == "tiny":
    configs["sigma_moe"].model.ff.update(n_experts=4, expert_size=8)
    configs["dense"].model.ff.d_ff = 32
  return configs


def main(argv=None) -> dict:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--preset", choices=("default", "tiny"), default="default")
  parser.add_argument("--rounds", type=int, default=30)
  parser.add_argument("--out", default="benchmarks/default_step_cpu.json")
  args = parser.parse_args(argv)
  machine = machine_info()
  configs = bench_configs(args.preset)
  mesh = parallel.make_mesh([1, 1, 1])
  with jax.set_mesh(mesh):
    runs = {name: LMTrainStep(config, mesh) for name, config in configs.items()}
    rng = np.random.default_rng(0)
    batches = [runs["dense"].random_batch(rng) for _ in range(4)]
    times = abba_step_times(runs, batches, args.rounds)
  step_ms = {name: 1e3 * statistics.median(t) for name, t in times.items()}
  ratio = statistics.median(d / m for d, m in zip(times["dense"], times["sigma_moe"]))
  moe = configs["sigma_moe"].model.ff
  print(f"\n### Training step of sparse_jax/configs/default.py vs its dense twin (median of {args.rounds} "
        f"ABBA-interleaved steps, N_E {moe.n_experts}, G {moe.expert_size}, K {moe.k})\n")
  print("| model | step ms |\n|---|---:|")
  for name in ("dense", "sigma_moe"):
    print(f"| {name} | {step_ms[name]:.1f} |")
  print(f"\nsigma-MoE speed-up over dense: {ratio:.2f}x (median paired ratio)")
  result = {"machine": machine, **vars(args), "step_ms": step_ms,
            "moe_speedup_median_paired": ratio, "step_seconds": times}
  write_result(result, args.out)
  return result


if __name__ == "__main__":
  main()
