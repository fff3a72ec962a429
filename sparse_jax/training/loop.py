"""The training loop of every task: build, resume, step, log, evaluate, checkpoint.

`run_task(task, workdir)` builds a `Run` of a task (`training.task.Task`; the tasks and
`train_and_evaluate(config, workdir)`, which picks one from a config, are in
`sparse_jax.tasks`) on the mesh and loops. Logging syncs with the device once per `train.log_every` steps;
a non-finite loss stops the run (the last good checkpoint is kept); SIGTERM/SIGINT save and
stop (every process after the same step: `training.preemption`); a failed checkpoint write
stops it (`CheckpointWriteError`); resuming restores the newest checkpoint that reads back,
with a config that may resume from it (`training.resume_config`); only the first process
prints, writes metrics (with the model FLOPs rate and MFU, `training.mfu`) and shows
progress. `train.profile_steps` traces a few steps (`training.profiling`).

Time is logged so that a run's wall time can be summed over the invocations that resumed it
(`training.metrics_log.logged_seconds`): each train line's `train_seconds` counts only its
window's training steps (its rate and MFU likewise), each validation line's `eval_seconds`
the evaluation, and an invocation's first train line `compile_seconds`, the training step's
compilation; checkpoint saves (written in the background) are in none of them. All of these
read `clock`, the loop's one time source.
"""

import contextlib
import time

import jax
import numpy as np
from absl import logging
from flax import nnx
from jax.sharding import Mesh
from tqdm import tqdm

from sparse_jax import parallel
from sparse_jax.training.checkpointing import Checkpointer
from sparse_jax.training.metrics_log import MetricsWriter
from sparse_jax.training.mfu import ModelFlopsRate
from sparse_jax.training.optimizer import learning_rate_schedule
from sparse_jax.training.placement import Placement
from sparse_jax.training.preemption import StopRequest
from sparse_jax.training.profiling import StepProfiler
from sparse_jax.training.routing_health import RoutingHealth
from sparse_jax.training.steps import make_train_step
from sparse_jax.training.task import Task
from sparse_jax.training.xla_fallbacks import compile_lowered


clock = time.perf_counter  # Seconds, for the logged times; a test puts a fake clock here.


class NonFiniteLossError(RuntimeError):
  """The training loss became NaN or infinite; the last good checkpoint is kept."""


def is_main_process() -> bool:
  return jax.process_index() == 0


def _print(message: str, write=print) -> None:
  """Prints on the first process only."""
  if is_main_process():
    write(message)


def format_metrics(metrics: dict[str, float]) -> str:
  return ", ".join(f"{k}={v:.4g}" for k, v in metrics.items())


def _mean_over_steps(values: list) -> float | np.ndarray:
  """One metric's mean over a window's steps: a float, or a vector's elementwise mean."""
  mean = np.mean(values, axis=0)
  return float(mean) if mean.ndim == 0 else mean


class MetricsWindow:
  """Per-step metrics since the last log, kept on device until `flush` syncs once, and the
  wall time of those steps: what runs inside `paused()` (evaluation, saves, compilation) is
  not counted."""

  def __init__(self, start_step: int):
    self.start_step, self.metrics = start_step, []
    self.started, self.paused_seconds = clock(), 0.0

  @contextlib.contextmanager
  def paused(self):
    started = clock()
    try:
      yield
    finally:
      self.paused_seconds += clock() - started

  def flush(self, items_per_step: int, rate_name: str) -> dict[str, float]:
    """The window's mean metrics (a per-step vector, such as a layer's routing
    `token_share`, elementwise) plus `rate_name` (items per second) and `train_seconds`;
    raises `NonFiniteLossError` naming the first step whose loss is not finite."""
    host = jax.device_get(self.metrics)
    losses = np.array([m["loss"] for m in host])
    bad = np.flatnonzero(~np.isfinite(losses))
    if bad.size:
      step = self.start_step + int(bad[0]) + 1
      raise NonFiniteLossError(
          f"training loss is {losses[bad[0]]} at step {step}; stopping. The last good "
          "checkpoint is kept; lower train.lr or check the data.")
    seconds = clock() - self.started - self.paused_seconds
    mean = {k: _mean_over_steps([m[k] for m in host]) for k in host[0]}
    mean[rate_name] = items_per_step * len(host) / seconds
    mean["train_seconds"] = seconds
    return mean


class Run:
  """A training run's objects: the task's model, optimiser, data and carry, the jitted step,
  checkpoints and outputs, all on `mesh` (state sharded by `sparse_jax.parallel`'s rules,
  batches split over the batch axes; this process reads only its own rows)."""

  def __init__(self, task: Task, workdir: str, mesh: Mesh):
    train_cfg = task.typed.train
    self.task, self.workdir = task, workdir
    self.config = task.resolved_config()  # What checkpoints store.
    self.placement = placement = Placement(mesh)
    task.check_mesh(placement)
    task.check_accumulation(placement)
    self.checkpointer = Checkpointer(workdir, max_to_keep=train_cfg.keep_checkpoints,
                                     params=task.checkpoint_params)
    try:
      restored = self._build_and_restore()
    except BaseException:
      self.checkpointer.close()
      raise
    self.start = 0
    if restored:
      self.start, extras = restored
      _print(f"Resuming from the checkpoint of step {self.start} in {workdir}.")
      self.carry = task.carry_from_extras(extras, self.carry)
    task.start(workdir, self.start)
    self.writer = MetricsWriter(workdir) if is_main_process() else None
    self.routing_health = RoutingHealth(warn=is_main_process())
    self.lr = learning_rate_schedule(train_cfg)
    self.flops_rate = ModelFlopsRate.of(task.flops_per_step(self.model),
                                        np.dtype(self.model.dtype).name, mesh)
    self.graphdef, state = nnx.split((self.model, self.optimizer))
    self.state = nnx.to_pure_dict(state)  # As the step carries it (`make_train_step`).
    out_shardings = (nnx.to_pure_dict(placement.state_shardings(state)),
                     task.carry_shardings(placement), parallel.replicated(mesh))
    self.train_step = make_train_step(self.graphdef, task.loss, seed=task.typed.seed,
                                      rng_impl=train_cfg.rng_impl, wrt=task.trainable,
                                      out_shardings=out_shardings,
                                      accum_steps=train_cfg.grad_accum_steps, carry_rows=task)
    self.compiled_step = None  # Compiled at the first step (`_compile_step`).
    self.compile_seconds = None  # Logged once, with the first train line.
    self.in_flight = None  # The loss of the step last dispatched (`step`).

  def _build_and_restore(self) -> tuple[int, dict] | None:
    """Checks the config may resume, builds the task's objects and restores the newest
    checkpoint that reads back (`Checkpointer.restore_latest`)."""
    task, placement = self.task, self.placement
    self.checkpointer.check_resume(self.config, task.resolve)
    self.model, self.optimizer = task.build(placement)
    self.data_iterator = task.load_data(placement)
    self.carry = task.init_carry(self.model, placement)
    return self.checkpointer.restore_latest(
        model=self.model, optimizer=self.optimizer, data_iterator=self.data_iterator,
        extras=task.checkpoint_extras(self.carry))

  def step(self, step: int, pause=contextlib.nullcontext) -> dict[str, jax.Array]:
    """Runs training step `step` (0-based); returns its metrics, still on device. The first
    call compiles the step, inside `pause()` (`MetricsWindow.paused`).

    Returns once the step before it has finished: one step computes while the host reads
    the next batch, and no more. Left alone, JAX queues dozens of steps ahead of the device
    (on XLA:CPU, minutes of them), so the progress bar would count queued steps and a
    SIGTERM would wait for the whole queue before its checkpoint, past a preemption's grace
    period."""
    batch = self.placement.global_batch(next(self.data_iterator), self.task.batch_size)
    if self.compiled_step is None:
      started = clock()
      with pause():
        self.compiled_step = self._compile_step(batch, step)
      self.compile_seconds = clock() - started
    self.state, self.carry, metrics = self.compiled_step(self.state, self.carry, batch, step)
    if self.in_flight is not None:
      jax.block_until_ready(self.in_flight)
    self.in_flight = metrics["loss"]
    return metrics

  def _compile_step(self, batch, step: int) -> jax.stages.Compiled:
    """The training step compiled once for this run's shapes, with the XLA options it needs
    on this platform (`training.xla_fallbacks`: on GPUs, without Triton GEMMs if their
    tiling fails)."""
    lowered = self.train_step.trace(self.state, self.carry, batch, step).lower()
    compiled, options = compile_lowered(lowered, self.placement.mesh.devices.flat[0].platform)
    if options:
      _print(f"The training step needed XLA options {options} to compile "
             "(sparse_jax.training.xla_fallbacks).")
    return compiled

  def log(self, step: int, window: MetricsWindow) -> dict[str, float]:
    """Writes the window's metrics (each MoE layer's token shares turned into its routing
    health, `training.routing_health`); raises if its loss is not finite or if a checkpoint
    write has failed in the background since (so a failed save stops the run here)."""
    self.checkpointer.check_writes()
    logged = self.routing_health(step, window.flush(self.task.items_per_step,
                                                    self.task.rate_name))
    logged.update(self.task.log_metrics(logged), lr=float(self.lr(step - 1)))
    steps_per_second = logged[self.task.rate_name] / self.task.items_per_step
    logged.update(self.flops_rate.metrics(steps_per_second))  # training.mfu
    if self.compile_seconds is not None:
      logged["compile_seconds"], self.compile_seconds = self.compile_seconds, None
    self._write(step, "train", logged)
    return logged

  def _write(self, step: int, split: str, metrics: dict[str, float]) -> None:
    if self.writer:
      self.writer.write(step, split, metrics)

  def sync_to_modules(self) -> None:
    """Puts the jitted step's current state back into the model and optimiser objects."""
    nnx.update((self.model, self.optimizer), self.state)

  def evaluate(self, step: int) -> dict[str, float]:
    """The task's validation metrics, logged with the `eval_seconds` they took."""
    started = clock()
    self.sync_to_modules()
    metrics = self.task.evaluate(self.model, self.placement)
    self._write(step, "validation",
                {**metrics, "eval_seconds": clock() - started})
    return metrics

  def save(self, step: int) -> None:
    self.sync_to_modules()
    self.checkpointer.save(step, model=self.model, optimizer=self.optimizer,
                           data_iterator=self.data_iterator, config=self.config,
                           extras=self.task.checkpoint_extras(self.carry))

  def close(self) -> None:
    """Waits for checkpoint writes to finish (raising if one failed), then closes the
    outputs."""
    try:
      self.checkpointer.wait()
    finally:
      self.checkpointer.close()
      if self.writer:
        self.writer.close()


def run_task(task: Task, workdir: str, mesh: Mesh | None = None) -> dict[str, float]:
  """Trains `task` in `workdir` (resuming if it holds checkpoints) on `mesh` (default: its
  config's `mesh` section over this job's devices); returns the final validation metrics.

  Logs every `train.log_every` steps, evaluates every `train.eval_every` steps and at the
  end, checkpoints every `train.ckpt_every` steps, at the end and on SIGTERM/SIGINT.
  """
  if mesh is None:
    mesh = parallel.mesh_from_config(task.typed.mesh)
  train_cfg = task.typed.train
  run = Run(task, workdir, mesh)
  step, window = run.start, MetricsWindow(run.start)
  try:
    with (StopRequest(mesh) as stop, jax.set_mesh(mesh),
          StepProfiler(train_cfg.profile_window, workdir) as profiler,
          tqdm(initial=step, total=train_cfg.steps, desc=task.name,
               disable=not is_main_process()) as bar):
      stopping = stop.should_stop()  # With several processes: the same on every one.
      while step < train_cfg.steps and not stopping:
        with profiler.step(step, lambda: run.state):  # train.profile_steps
          window.metrics.append(run.step(step, pause=window.paused))
        step += 1
        bar.update(1)
        stopping = stop.should_stop()
        at_ckpt = step % train_cfg.ckpt_every == 0 or step == train_cfg.steps or stopping
        if step % train_cfg.log_every == 0 or at_ckpt:
          bar.set_postfix(loss=f"{run.log(step, window)['loss']:.3f}")
          window = MetricsWindow(step)
        with window.paused():
          if step % train_cfg.eval_every == 0 and step < train_cfg.steps:
            _print(f"step {step} validation: {format_metrics(run.evaluate(step))}", bar.write)
          if at_ckpt:
            run.save(step)
      if stopping:
        logging.warning("Stopped at step %d; checkpoint saved in %s.", step, workdir)
        return {"step": step, "interrupted": 1.0}
      metrics = run.evaluate(step)
    run.checkpointer.wait()
    return {"step": step, **metrics, **task.finish(run, step)}
  finally:
    run.close()

