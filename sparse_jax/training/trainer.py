"""The training loop: build from config, resume, step, log, evaluate, checkpoint."""

import time

import jax
import ml_collections
import numpy as np
from absl import logging
from flax import nnx
from tqdm import tqdm

from sparse_jax import data
from sparse_jax.models.lm import TransformerLM
from sparse_jax.training.checkpointing import Checkpointer
from sparse_jax.training.config_checks import validate_config
from sparse_jax.training.evaluation import Evaluator, unit_metric
from sparse_jax.training.metrics_writer import MetricsWriter
from sparse_jax.training.optimizer import learning_rate_schedule, make_optimizer
from sparse_jax.training.preemption import StopRequest
from sparse_jax.training.steps import make_rngs, make_train_step


class NonFiniteLossError(RuntimeError):
  """The training loss became NaN or infinite; the last good checkpoint is kept."""


def build_model(config: ml_collections.ConfigDict) -> TransformerLM:
  return TransformerLM(config.model, rngs=make_rngs(config.seed))


def make_evaluator(config: ml_collections.ConfigDict, model: TransformerLM) -> Evaluator:
  return Evaluator(model, batch_size=config.eval.batch_size, seq_len=config.data.seq_len,
                   mem_len=config.eval.mem_len, unit=data.spec(config.data).unit)


class _Window:
  """Per-step metrics since the last log, kept on device until `flush` syncs once."""

  def __init__(self, start_step: int):
    self.start_step, self.metrics, self.started = start_step, [], time.perf_counter()

  def flush(self, tokens_per_step: int) -> dict[str, float]:
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
    mean["tokens_per_second"] = tokens_per_step * len(host) / seconds
    return mean


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str) -> dict[str, float]:
  """Trains `config` in `workdir` (resuming if it holds checkpoints); returns final metrics."""
  validate_config(config)
  batch, seq_len, steps = config.data.batch_size, config.data.seq_len, config.train.steps
  unit = data.spec(config.data).unit
  train_tokens = data.load_tokens(config.data, "train")
  valid = data.load_split(config.data, "validation")
  model = build_model(config)
  optimizer = nnx.Optimizer(model, make_optimizer(config.train), wrt=nnx.Param)
  data_iterator = data.train_iterator(train_tokens, batch, seq_len)
  memory = model.init_memory(batch)
  checkpointer = Checkpointer(workdir, max_to_keep=config.train.keep_checkpoints)
  start = checkpointer.latest_step() or 0
  if start:
    print(f"Resuming from the checkpoint of step {start} in {workdir}.")
    memory = checkpointer.restore(start, model=model, optimizer=optimizer, memory=memory,
                                  data_iterator=data_iterator)
  evaluator = make_evaluator(config, model)
  writer = MetricsWriter(workdir)
  lr = learning_rate_schedule(config.train)
  graphdef, state = nnx.split((model, optimizer))
  train_step = make_train_step(graphdef, config.seed)

  def sync_to_modules():
    nnx.update((model, optimizer), state)

  def evaluate(step: int, max_batches) -> dict[str, float]:
    sync_to_modules()
    metrics = evaluator(model, valid.tokens, max_batches=max_batches,
                        words_per_token=valid.words_per_token)
    writer.write(step, "validation", metrics)
    return metrics

  window = _Window(start)
  step = start
  try:
    with StopRequest() as stop, tqdm(initial=start, total=steps, desc="train") as bar:
      while step < steps and not stop.requested:
        state, memory, metrics = train_step(state, memory, next(data_iterator), step)
        window.metrics.append(metrics)
        step += 1
        bar.update(1)
        at_ckpt = step % config.train.ckpt_every == 0 or step == steps or stop.requested
        if step % config.train.log_every == 0 or at_ckpt:
          logged = window.flush(batch * seq_len)
          logged.update(unit_metric(logged["ce"], unit), lr=float(lr(step - 1)))
          writer.write(step, "train", logged)
          bar.set_postfix(loss=f"{logged['loss']:.3f}")
          window = _Window(step)
        if step % config.train.eval_every == 0 and step < steps:
          bar.write(f"step {step}: validation {evaluate(step, config.eval.max_batches)}")
        if at_ckpt:
          sync_to_modules()
          checkpointer.save(step, model=model, optimizer=optimizer, memory=memory,
                            data_iterator=data_iterator, config=config)
    if stop.requested:
      logging.warning("Stopped at step %d; checkpoint saved in %s.", step, workdir)
      return {"step": step, "interrupted": 1.0}
    return {"step": step, **evaluate(step, config.eval.max_batches)}
  finally:
    checkpointer.wait()
    checkpointer.close()
    writer.close()
