"""Fine-tuning a frozen backbone on a classification task: what `train.py` runs for configs
with a `task` section (`configs/spartan_*.py`), and what `eval.py` evaluates.

Config sections: `task` (`sparse_jax.data.classification`; plus `max_len` and `n_train`, the
few-shot subset size or None for the whole split), `backbone` (`training.backbones`),
`method` (`training.freezing`), `train` (the LM trainer's fields plus `batch_size`), `eval`
(`batch_size`, `max_examples`).
"""

import json
import os

import jax
import ml_collections
import numpy as np
from absl import logging
from flax import nnx
from tqdm import tqdm

from sparse_jax import validation
from sparse_jax.data import classification, task_batches
from sparse_jax.training import classification_metrics
from sparse_jax.analysis.storage import storage_report
from sparse_jax.training.backbones import (backbone_model_config, build_classifier,
                                           validate_backbone_config)
from sparse_jax.training.freezing import trainable_filter, validate_method_config
from sparse_jax.training.metrics_writer import MetricsWriter
from sparse_jax.training.optimizer import make_optimizer, validate_train_config
from sparse_jax.training.preemption import StopRequest
from sparse_jax.training.task_checkpointing import TaskCheckpointer
from sparse_jax.training.task_steps import make_predict_step, make_task_train_step
from sparse_jax.training.trainer import MetricsWindow


def is_finetune_config(config: ml_collections.ConfigDict) -> bool:
  return "task" in config


def validate_finetune_config(config: ml_collections.ConfigDict) -> None:
  """Raises `ConfigError` naming the first bad field, before anything is loaded."""
  for section in ("task", "backbone", "method", "train", "eval"):
    validation.require(section in config, section, "a config section", None)
  validation.require(isinstance(config.get("seed"), int), "seed", "an integer",
                     config.get("seed"))
  classification.task_spec(config.task)
  validation.require_positive_int(config.task.get("max_len"), "task.max_len")
  n_train = config.task.get("n_train")
  validation.require(n_train is None or (isinstance(n_train, int) and n_train > 0),
                     "task.n_train", "None (the whole split) or a positive integer", n_train)
  validate_backbone_config(config.backbone)
  validate_method_config(config.method)
  validate_train_config(config.train)
  validation.require_positive_int(config.train.get("batch_size"), "train.batch_size")
  validation.require_positive_int(config.eval.get("batch_size"), "eval.batch_size")
  max_examples = config.eval.get("max_examples")
  validation.require(max_examples is None or (isinstance(max_examples, int) and max_examples > 0),
                     "eval.max_examples", "None (the whole split) or a positive integer",
                     max_examples)


class HiddenLabelsError(ValueError):
  """The split's labels are hidden (GLUE test splits), so it cannot be scored."""


def finetune_storage_report(config: ml_collections.ConfigDict) -> dict:
  """Parameters and storage per task of `config`'s method on its backbone (SPARTAN App. E)."""
  validate_finetune_config(config)
  spec = classification.task_spec(config.task)
  return storage_report(backbone_model_config(config.backbone), config.method,
                        num_classes=spec.num_classes)


def tokenized_split(config, spec, tokenizer, split: str, *, n_examples=None):
  """A task split as arrays: `tokens [N, max_len]`, `lengths [N]`, `labels [N]`."""
  data = classification.load_task_split(config.task, split, n_examples=n_examples,
                                        seed=config.seed)
  tokens, lengths = tokenizer.encode(data.texts, config.task.max_len)
  return {"tokens": tokens, "lengths": lengths, "labels": data.labels}


def evaluate(predict, model_state, arrays, spec, batch_size: int) -> dict[str, float]:
  """The task's metrics (`spec.metrics`) of the model's predictions on `arrays`."""
  if np.all(arrays["labels"] < 0):
    raise HiddenLabelsError(f"{spec.name}: this split's labels are hidden (GLUE test splits); "
                     f"evaluate on {spec.eval_split!r} or submit predictions to GLUE.")
  preds = []
  for batch in task_batches.eval_batches(arrays, batch_size):
    weights = batch.pop("weights")
    preds.append(np.asarray(predict(model_state, batch))[weights > 0])
  return classification_metrics.compute(spec.metrics, np.concatenate(preds), arrays["labels"])


class _FinetuneRun:
  """A fine-tuning run's objects: model, optimiser, data, checkpoints, outputs."""

  def __init__(self, config: ml_collections.ConfigDict, workdir: str):
    self.config, self.spec = config, classification.task_spec(config.task)
    self.model, tokenizer = build_classifier(config, self.spec.num_classes)
    self.trainable = trainable_filter(config.method)
    self.optimizer = nnx.Optimizer(self.model, make_optimizer(config.train), wrt=self.trainable)
    train = tokenized_split(config, self.spec, tokenizer, "train",
                            n_examples=config.task.get("n_train"))
    self.valid = tokenized_split(config, self.spec, tokenizer, self.spec.eval_split,
                                 n_examples=config.eval.get("max_examples"))
    self.data_iterator = task_batches.train_iterator(train, config.train.batch_size,
                                                     config.seed)
    self.checkpointer = TaskCheckpointer(workdir, max_to_keep=config.train.keep_checkpoints)
    self.start = self.checkpointer.latest_step() or 0
    if self.start:
      print(f"Resuming from the checkpoint of step {self.start} in {workdir}.")
      self.checkpointer.restore(self.start, model=self.model, trainable=self.trainable,
                                optimizer=self.optimizer, data_iterator=self.data_iterator)
    self.writer = MetricsWriter(workdir)
    self.graphdef, state = nnx.split((self.model, self.optimizer))
    # Committed like the step's outputs, so the second step reuses the first's compilation.
    self.state = jax.device_put(state, jax.local_devices()[0])
    self.train_step = make_task_train_step(self.graphdef, config.seed, self.trainable)
    self.model_graphdef = nnx.graphdef(self.model)
    self.predict = make_predict_step(self.model_graphdef)

  def evaluate(self, step: int) -> dict[str, float]:
    nnx.update((self.model, self.optimizer), self.state)
    metrics = evaluate(self.predict, nnx.state(self.model), self.valid, self.spec,
                       self.config.eval.batch_size)
    self.writer.write(step, "validation", metrics)
    return metrics

  def save(self, step: int) -> None:
    nnx.update((self.model, self.optimizer), self.state)
    self.checkpointer.save(step, model=self.model, trainable=self.trainable,
                           optimizer=self.optimizer, data_iterator=self.data_iterator,
                           config=self.config)

  def close(self) -> None:
    self.checkpointer.wait()
    self.checkpointer.close()
    self.writer.close()


def _write_storage(run: _FinetuneRun, workdir: str, step: int) -> dict:
  """`storage.json`: the trainable parameters and their bytes on disk (one task's cost)."""
  n_trainable = sum(x.size for x in jax.tree.leaves(nnx.state(run.model, run.trainable)))
  n_total = sum(x.size for x in jax.tree.leaves(nnx.state(run.model, nnx.Param)))
  report = {"method": run.config.method.kind, "trainable_params": int(n_trainable),
            "total_params": int(n_total),
            "trainable_bytes_on_disk": run.checkpointer.trainable_bytes(step)}
  with open(os.path.join(workdir, "storage.json"), "w", encoding="utf-8") as f:
    json.dump(report, f, indent=2)
  return report


def finetune_and_evaluate(config: ml_collections.ConfigDict, workdir: str) -> dict[str, float]:
  """Fine-tunes `config` in `workdir` (resuming if it holds checkpoints); returns the final
  validation metrics. Logs, evaluates and checkpoints like `train_and_evaluate`."""
  validate_finetune_config(config)
  train_cfg = config.train
  run = _FinetuneRun(config, workdir)
  step, window = run.start, MetricsWindow(run.start)
  try:
    with StopRequest() as stop, tqdm(initial=step, total=train_cfg.steps, desc="finetune") as bar:
      while step < train_cfg.steps and not stop.requested:
        run.state, metrics = run.train_step(run.state, next(run.data_iterator), step)
        window.metrics.append(metrics)
        step += 1
        bar.update(1)
        at_ckpt = step % train_cfg.ckpt_every == 0 or step == train_cfg.steps or stop.requested
        if step % train_cfg.log_every == 0 or at_ckpt:
          logged = window.flush(train_cfg.batch_size, "examples_per_second")
          run.writer.write(step, "train", logged)
          bar.set_postfix(loss=f"{logged['loss']:.3f}")
          window = MetricsWindow(step)
        if step % train_cfg.eval_every == 0 and step < train_cfg.steps:
          bar.write(f"step {step} validation: {run.evaluate(step)}")
        if at_ckpt:
          run.save(step)
    if stop.requested:
      logging.warning("Stopped at step %d; checkpoint saved in %s.", step, workdir)
      return {"step": step, "interrupted": 1.0}
    metrics = run.evaluate(step)
    run.checkpointer.wait()
    storage = _write_storage(run, workdir, step)
    return {"step": step, **metrics, "trainable_params": storage["trainable_params"]}
  finally:
    run.close()


def evaluate_task_checkpoint(workdir: str, config: ml_collections.ConfigDict, step: int,
                             split: str | None = None) -> dict[str, float]:
  """Rebuilds the backbone from `config.backbone`, puts step `step`'s trainable part on it
  and scores `split` (default: the task's validation split)."""
  spec = classification.task_spec(config.task)
  model, tokenizer = build_classifier(config, spec.num_classes)
  checkpointer = TaskCheckpointer(workdir)
  try:
    checkpointer.restore_trainable(step, model, trainable_filter(config.method))
  finally:
    checkpointer.close()
  split = spec.eval_split if split in (None, "validation") else split
  arrays = tokenized_split(config, spec, tokenizer, split)
  predict = make_predict_step(nnx.graphdef(model))
  return evaluate(predict, nnx.state(model), arrays, spec, config.eval.batch_size)
