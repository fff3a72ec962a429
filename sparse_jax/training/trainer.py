"""The training loop: build from config, resume, step, log, evaluate, checkpoint."""

import time

import jax
import ml_collections
import numpy as np
from absl import logging
from flax import nnx
from jax.sharding import Mesh
from tqdm import tqdm

from sparse_jax import data, parallel
from sparse_jax.models.lm import TransformerLM
from sparse_jax.training.checkpointing import Checkpointer
from sparse_jax.training.config_checks import validate_config
from sparse_jax.training.evaluation import Evaluator, unit_metric
from sparse_jax.training.metrics_writer import MetricsWriter
from sparse_jax.training.optimizer import learning_rate_schedule, make_optimizer
from sparse_jax.training.placement import Placement
from sparse_jax.training.preemption import StopRequest
from sparse_jax.training.steps import make_rngs, make_train_step


class NonFiniteLossError(RuntimeError):
  """The training loss became NaN or infinite; the last good checkpoint is kept."""


def build_model(config: ml_collections.ConfigDict) -> TransformerLM:
  return TransformerLM(config.model, rngs=make_rngs(config.seed))


def build_model_and_optimizer(config: ml_collections.ConfigDict):
  """The model and its optimiser (state for `nnx.Param`s only)."""
  model = build_model(config)
  return model, nnx.Optimizer(model, make_optimizer(config.train), wrt=nnx.Param)


def make_evaluator(config: ml_collections.ConfigDict, model: TransformerLM,
                   placement: Placement | None = None) -> Evaluator:
  return Evaluator(model, batch_size=config.eval.batch_size, seq_len=config.data.seq_len,
                   mem_len=config.eval.mem_len, unit=data.spec(config.data).unit,
                   placement=placement)


def _print(message: str, write=print) -> None:
  """Prints on the first process only."""
  if jax.process_index() == 0:
    write(message)


class MetricsWindow:
  """Per-step metrics since the last log, kept on device until `flush` syncs once."""

  def __init__(self, start_step: int):
    self.start_step, self.metrics, self.started = start_step, [], time.perf_counter()

  def flush(self, items_per_step: int, rate_name: str = "tokens_per_second"
            ) -> dict[str, float]:
    """The window's mean metrics plus `rate_name` (items per second); raises
    `NonFiniteLossError` naming the first step whose loss is not finite."""
    host = jax.device_get(self.metrics)
    losses = np.array([m["loss"] for m in host])
    bad = np.flatnonzero(~np.isfinite(losses))
    if bad.size:
      step = self.start_step + int(bad[0]) + 1
      raise NonFiniteLossError(
          f"training loss is {losses[bad[0]]} at step {step}; stopping. The last good "
          "checkpoint is kept; lower train.lr or check the data.")
    seconds = time.perf_counter() - self.started
    mean = {k: float(np.mean([m[k] for m in host])) for k in host[0]}
    mean[rate_name] = items_per_step * len(host) / seconds
    return mean


class _Run:
  """A training run's objects: model, optimiser, jitted state, memory, data, outputs.

  Everything lives on `mesh`: state sharded by `sparse_jax.parallel`'s rules, memory and
  batches split over the batch axes; this process reads only its own streams.
  """

  def __init__(self, config: ml_collections.ConfigDict, workdir: str, mesh: Mesh):
    self.config, self.workdir = config, workdir
    self.placement = placement = Placement(mesh)
    placement.check_config(config)
    self.batch, seq_len = config.data.batch_size, config.data.seq_len
    self.tokens_per_step = self.batch * seq_len
    self.unit = data.spec(config.data).unit
    self.valid = data.load_split(config.data, "validation")
    self.data_iterator = data.train_iterator(data.load_tokens(config.data, "train"), self.batch,
                                             seq_len, placement.data_shard(self.batch))
    self.model, self.optimizer = placement.create(lambda: build_model_and_optimizer(config))
    self.memory = placement.create_memory(lambda: self.model.init_memory(self.batch))
    self.checkpointer = Checkpointer(workdir, max_to_keep=config.train.keep_checkpoints)
    self.start = self.checkpointer.latest_step() or 0
    if self.start:
      _print(f"Resuming from the checkpoint of step {self.start} in {workdir}.")
      self.memory = self.checkpointer.restore(
          self.start, model=self.model, optimizer=self.optimizer, memory=self.memory,
          data_iterator=self.data_iterator)
    self.evaluator = make_evaluator(config, self.model, placement)
    self.writer = MetricsWriter(workdir) if jax.process_index() == 0 else None
    self.lr = learning_rate_schedule(config.train)
    self.graphdef, self.state = nnx.split((self.model, self.optimizer))
    out_shardings = (placement.state_shardings(self.state), placement.memory_shardings(),
                     parallel.replicated(mesh))
    self.train_step = make_train_step(self.graphdef, config.seed, out_shardings)

  def step(self, step: int) -> dict[str, jax.Array]:
    """Runs training step `step` (0-based); returns its metrics, still on device."""
    batch = self.placement.global_batch(next(self.data_iterator), self.batch)
    self.state, self.memory, metrics = self.train_step(self.state, self.memory, batch, step)
    return metrics

  def log(self, step: int, window: MetricsWindow) -> dict[str, float]:
    logged = window.flush(self.tokens_per_step)
    logged.update(unit_metric(logged["ce"], self.unit), lr=float(self.lr(step - 1)))
    self._write(step, "train", logged)
    return logged

  def _write(self, step: int, split: str, metrics: dict[str, float]) -> None:
    if self.writer:
      self.writer.write(step, split, metrics)

  def _sync_to_modules(self) -> None:
    """Puts the jitted step's current state back into the model and optimiser objects."""
    nnx.update((self.model, self.optimizer), self.state)

  def evaluate(self, step: int) -> dict[str, float]:
    self._sync_to_modules()
    metrics = self.evaluator(self.model, self.valid.tokens,
                             max_batches=self.config.eval.max_batches,
                             words_per_token=self.valid.words_per_token)
    self._write(step, "validation", metrics)
    return metrics

  def save(self, step: int) -> None:
    self._sync_to_modules()
    self.checkpointer.save(step, model=self.model, optimizer=self.optimizer,
                           memory=self.memory, data_iterator=self.data_iterator,
                           config=self.config)

  def close(self) -> None:
    """Waits for checkpoint writes to finish, then closes the outputs."""
    self.checkpointer.wait()
    self.checkpointer.close()
    if self.writer:
      self.writer.close()


def _format(metrics: dict[str, float]) -> str:
  return ", ".join(f"{k}={v:.4g}" for k, v in metrics.items())


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str, *,
                       mesh: Mesh | None = None) -> dict[str, float]:
  """Trains `config` in `workdir` (resuming if it holds checkpoints); returns final metrics.

  Runs on `mesh` (default: the mesh of `config.mesh` over this job's devices). Logs every
  `train.log_every` steps, evaluates every `train.eval_every` steps and at the end,
  checkpoints every `train.ckpt_every` steps, at the end and on SIGTERM/SIGINT. Only the
  first process writes metrics and shows progress.
  """
  validate_config(config)
  train_cfg = config.train
  if mesh is None:
    mesh = parallel.mesh_from_config(config.get("mesh", {}))
  run = _Run(config, workdir, mesh)
  step, window = run.start, MetricsWindow(run.start)
  try:
    with (StopRequest() as stop, jax.set_mesh(mesh),
          tqdm(initial=step, total=train_cfg.steps, desc="train",
               disable=jax.process_index() != 0) as bar):
      while step < train_cfg.steps and not stop.requested:
        window.metrics.append(run.step(step))
        step += 1
        bar.update(1)
        at_ckpt = step % train_cfg.ckpt_every == 0 or step == train_cfg.steps or stop.requested
        if step % train_cfg.log_every == 0 or at_ckpt:
          bar.set_postfix(loss=f"{run.log(step, window)['loss']:.3f}")
          window = MetricsWindow(step)
        if step % train_cfg.eval_every == 0 and step < train_cfg.steps:
          _print(f"step {step} validation: {_format(run.evaluate(step))}", bar.write)
        if at_ckpt:
          run.save(step)
    if stop.requested:
      logging.warning("Stopped at step %d; checkpoint saved in %s.", step, workdir)
      return {"step": step, "interrupted": 1.0}
    return {"step": step, **run.evaluate(step)}
  finally:
    run.close()
