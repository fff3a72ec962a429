"""Host time to dispatch a jitted call carrying the training state: as nested dicts of arrays
(what `make_train_step` takes and returns) against as an `nnx.State` (before 2026-11-29).

    python -m benchmarks.step_dispatch [--rounds=40] [--out=benchmarks/step_dispatch_cpu.json]

A jitted call flattens its arguments and rebuilds its outputs on the host before the device
has anything to do. JAX does that in C++ for dicts and arrays, but an `nnx.State` holds one
Python `Variable` per array, each flattened and rebuilt through Python; WT-103 S's training
state is 886 arrays. The models are the sigma-MoE paper's WT-103 S pair
(`sparse_jax/configs/wt103_s_dense.py`, `sigma_moe_paper.py:wt103_s`) with their layers, experts and
state arrays but widths shrunk (d_model 16, d_ff 16, G 4, batch 1 x 8), so that the device's
work is small. Two programs carry the state each way: the training step (on a CPU, XLA runs
much of so small a step on the calling thread, so its row includes some of the work), and a
program that only hands the state back (the host's cost alone). All four take turns call by
call in ABBA order (`--rounds` pairs) after one compiling call; prints the median time from a
call to its return and what the dicts save, writes JSON.

On a GPU the dispatch of a step overlaps the step before (`training.loop.Run.step`), so it
costs device time only when it is the longer of the two.
"""

import argparse
import statistics

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from benchmarks.lm_train_step import LMTrainStep, abba_step_times
from benchmarks.machine import machine_info, write_result
from sparse_jax.configs import sigma_moe_paper, wt103_s_dense
from sparse_jax import parallel


def bench_configs(preset: str) -> dict:
  """WT-103 S dense and sigma-MoE at negligible widths (`tiny`, the smoke test: the dense one
  alone at 2 layers)."""
  configs = {"dense": wt103_s_dense.get_config(), "sigma_moe": sigma_moe_paper.get_config()}
  for config in configs.values():
    config.mesh.data = 1
    config.data.update(batch_size=1, seq_len=8)
    config.model.update(d_model=16, n_heads=2, head_dim=8, mem_len=8)
  configs["dense"].model.ff.d_ff = 16
  configs["sigma_moe"].model.ff.expert_size = 4
  if preset == "tiny":
    configs["dense"].model.n_layers = 2
    return {"dense": configs["dense"]}
  return configs


class Carried:
  """A compiled `fn(state, memory, batch, index) -> (state, memory, metrics)` with its own
  copy of `step`'s state (as nested dicts, or as an `nnx.State` with `as_nnx_state`) and
  memory, each donated and carried from call to call."""

  def __init__(self, fn, step: LMTrainStep, batch: dict, as_nnx_state: bool):
    state = step.state
    if as_nnx_state:
      state = nnx.state(nnx.merge(step.graphdef, state))
    self.state, self.memory = jax.tree.map(jnp.copy, (state, step.memory))
    self.fn = jax.jit(fn, donate_argnums=(0, 1)).lower(self.state, self.memory, batch,
                                                       0).compile()

  def __call__(self, batch: dict, index: int) -> dict:
    self.state, self.memory, metrics = self.fn(self.state, self.memory, batch, index)
    return metrics


def carriers(step: LMTrainStep, batch: dict) -> dict[str, Carried]:
  """The training step, and a program that does nothing but hand its state back (the host's
  cost alone: no device work to wait for), each carrying the state both ways."""

  def train_nnx_state(state, memory, batch, index):
    pure, memory, metrics = step.step_fn(nnx.to_pure_dict(state), memory, batch, index)
    return nnx.state(nnx.merge(step.graphdef, pure)), memory, metrics

  def nothing(state, memory, batch, index):
    return state, memory, {"loss": jnp.asarray(index, jnp.float32)}

  return {"step/dicts": Carried(step.step_fn, step, batch, as_nnx_state=False),
          "step/nnx_state": Carried(train_nnx_state, step, batch, as_nnx_state=True),
          "nothing/dicts": Carried(nothing, step, batch, as_nnx_state=False),
          "nothing/nnx_state": Carried(nothing, step, batch, as_nnx_state=True)}


def main(argv=None) -> dict:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--preset", choices=("default", "tiny"), default="default")
  parser.add_argument("--rounds", type=int, default=40)
  parser.add_argument("--out", default="benchmarks/step_dispatch_cpu.json")
  args = parser.parse_args(argv)
  machine = machine_info()
  mesh = parallel.make_mesh([1, 1, 1])
  rows = {}
  with jax.set_mesh(mesh):
    for model, config in bench_configs(args.preset).items():
      step = LMTrainStep(config, mesh)
      batch = step.random_batch(np.random.default_rng(0))
      runs = carriers(step, batch)
      seconds = abba_step_times(runs, [batch], args.rounds, settle=jax.block_until_ready)
      rows[model] = {"state_arrays": len(jax.tree.leaves(step.state)),
                     "dispatch_ms": {k: 1e3 * statistics.median(v) for k, v in seconds.items()},
                     "dispatch_seconds": seconds}
  print(f"\n### Host ms to dispatch a call carrying WT-103 S's training state (median of "
        f"{args.rounds} ABBA-interleaved calls, widths shrunk)\n")
  print("| model | state arrays | program | nested dicts | nnx.State | saved |\n"
        "|---|---:|---|---:|---:|---:|")
  for model, row in rows.items():
    ms = row["dispatch_ms"]
    for program in ("step", "nothing"):
      dicts, state = ms[f"{program}/dicts"], ms[f"{program}/nnx_state"]
      print(f"| {model} | {row['state_arrays']} | {program} | {dicts:.2f} | {state:.2f} | "
            f"{state - dicts:.2f} |")
  result = {"machine": machine, **vars(args), "models": rows}
  write_result(result, args.out)
  return result


if __name__ == "__main__":
  main()
