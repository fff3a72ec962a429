"""A language model's training step on random tokens, built as training builds it, for the
benchmarks that time steps (`scaling`, `routing_health_cost`, `switchhead_small`, `gpu_suite`).

    step = LMTrainStep(config, mesh)              # the task's own loss (or `loss_fn=...`)
    batch = step.random_batch(np.random.default_rng(0))
    with jax.set_mesh(mesh):
      metrics = step(batch, 0)                    # one step; state and XL memory carried

The model, optimizer and memory are placed on `mesh` by `Placement` and the step is
`make_train_step` with the state's shardings, as in `sparse_jax/training/loop.py`, so a
timing measures the step `train.py` runs. `abba_step_times` times several such steps side by
side, taking turns, so that drift in the machine's load hits all of them alike.
"""

import time

import jax
import numpy as np
from flax import nnx

from sparse_jax import parallel
from sparse_jax.tasks.lm import LanguageModelTask, build_model_and_optimizer
from sparse_jax.training.placement import Placement
from sparse_jax.training.steps import make_train_step


class LMTrainStep:
  """One model's jitted training step (seed `config.seed`) with its own carried state."""

  def __init__(self, config, mesh, loss_fn=None):
    task = LanguageModelTask(config)
    self.config, self.mesh = task.typed, mesh
    self.placement = Placement(mesh)
    model, optimizer = self.placement.create(lambda: build_model_and_optimizer(self.config))
    self.memory = self.placement.create_memory(
        lambda: model.init_memory(self.config.data.batch_size))
    self.flops_per_step = task.flops_per_step(model)  # model FLOPs (`lm_step_flops`), for MFU
    self.graphdef, state = nnx.split((model, optimizer))
    self.state = nnx.to_pure_dict(state)  # As the step carries it (`make_train_step`).
    out_shardings = (nnx.to_pure_dict(self.placement.state_shardings(state)),
                     self.placement.memory_shardings(), parallel.replicated(mesh))
    self.step_fn = make_train_step(self.graphdef, loss_fn or task.loss, seed=self.config.seed,
                                   rng_impl=self.config.train.rng_impl,
                                   out_shardings=out_shardings)

  def random_batch(self, rng: np.random.Generator) -> dict:
    """Uniformly random tokens of the config's batch shape, placed on the mesh."""
    batch_size, seq_len = self.config.data.batch_size, self.config.data.seq_len
    tokens_bs = rng.integers(0, self.config.model.vocab_size, (batch_size, seq_len + 1),
                             np.int32)
    return self.placement.global_batch({"inputs": tokens_bs[:, :-1],
                                        "targets": tokens_bs[:, 1:]}, batch_size)

  def compile(self, batch: dict):
    """Compiles the step for `batch`'s shapes ahead of time (under the mesh) and runs that
    from now on; returns it (`memory_analysis()` gives its peak memory)."""
    with jax.set_mesh(self.mesh):
      self.step_fn = self.step_fn.lower(self.state, self.memory, batch, 0).compile()
    return self.step_fn

  def __call__(self, batch: dict, step: int) -> dict:
    """Runs training step `step` on `batch`; returns its metrics once computed."""
    return jax.block_until_ready(self.dispatch(batch, step))

  def run(self, batch: dict, first_step: int, steps: int) -> dict:
    """Runs steps `first_step ..` on `batch` as the training loop does (`training.loop.Run.
    step`): each is dispatched before the previous one is waited for, so the host's dispatch
    of a step overlaps the device's work on the one before; returns the last one's metrics
    once computed. Time it over `steps` (>= 1) for the step time training sees."""
    if steps < 1:
      raise ValueError(f"steps must be >= 1, got {steps}")
    in_flight = None
    for step in range(first_step, first_step + steps):
      metrics = self.dispatch(batch, step)
      if in_flight is not None:
        jax.block_until_ready(in_flight)
      in_flight = metrics["loss"]
    return jax.block_until_ready(metrics)

  def dispatch(self, batch: dict, step: int) -> dict:
    """Starts training step `step` on `batch`; returns its metrics without waiting for them."""
    self.state, self.memory, metrics = self.step_fn(self.state, self.memory, batch, step)
    return metrics


def abba_step_times(steps: dict, batches: list, rounds: int,
                    settle=lambda result: None) -> dict[str, list[float]]:
  """Seconds of each of `rounds` steps of every `steps[name](batch, step)`, the names taking
  turns in ABBA order (forward, then backward, ...) after one compiling call each.
  `settle(result)` runs after every call, off the clock (`jax.block_until_ready`: a call
  that returns before its work is done is timed to its return alone)."""
  for run in steps.values():
    settle(run(batches[0], 0))
  times = {name: [] for name in steps}
  for i in range(rounds):
    for name in (list(steps) if i % 2 == 0 else list(steps)[::-1]):
      start = time.perf_counter()
      result = steps[name](batches[i % len(batches)], i + 1)
      times[name].append(time.perf_counter() - start)
      settle(result)
  return times
