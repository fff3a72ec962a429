"""Sequence classification over a frozen backbone: what `train.py` runs for configs with a
`task` section (`sparse_jax/configs/glue.py`, `sparse_jax/configs/spartan_stdlib.py`), and what
`eval.py` scores.

Config sections: `task` (`sparse_jax.data.classification`; plus `max_len` and `n_train`, the
few-shot subset size or None for the whole split), `backbone` (`tasks.backbones`),
`method` (`finetune.methods`), `train` (the engine's fields plus `batch_size`), `eval`
(`batch_size`, `max_examples`), `mesh`. Checkpoints hold only the trainable part (item
`trainable`): restoring rebuilds the backbone from `backbone` and puts that part on top.
"""

import json
import os

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
from flax import nnx

from sparse_jax import parallel, schema
from sparse_jax.data import classification, task_batches
from sparse_jax.finetune import methods
from sparse_jax.finetune.storage import storage_report
from sparse_jax.models.accounting import classifier_step_flops
from sparse_jax.models.classifier import SequenceClassifier
from sparse_jax.models.lm_config import ModelConfig
from sparse_jax.models.tensor_support import check_tensor_parallel
from sparse_jax.tasks import backbones, classification_metrics
from sparse_jax.training import routing_health
from sparse_jax.training.checkpointing import ParamsItem
from sparse_jax.training.optimizer import BatchedTrainConfig, make_optimizer
from sparse_jax.training.placement import Placement
from sparse_jax.training.task import Task


class HiddenLabelsError(ValueError):
  """The split's labels are hidden (GLUE test splits), so it cannot be scored."""


class ClassificationEvalConfig(schema.Schema):
  """The `eval` section: batches of `batch_size`; `max_examples` None scores the whole
  validation split."""

  batch_size: schema.PositiveInt
  max_examples: schema.PositiveInt | None = None


class ClassificationExperiment(schema.Schema):
  """A fine-tuning config (module docstring), typed."""

  seed: int = 0
  task: classification.TaskConfig
  backbone: backbones.BackboneConfig
  method: methods.MethodConfig
  train: BatchedTrainConfig
  eval: ClassificationEvalConfig
  mesh: parallel.MeshConfig


def task_loss(logits_bc: jax.Array, labels_b: jax.Array) -> jax.Array:
  """Mean cross-entropy (C > 1 classes) or mean squared error (C = 1: regression)."""
  logits_bc = logits_bc.astype(jnp.float32)
  if logits_bc.shape[-1] == 1:
    return jnp.mean((logits_bc[:, 0] - labels_b.astype(jnp.float32)) ** 2)
  return optax.softmax_cross_entropy_with_integer_labels(logits_bc, labels_b).mean()


def predictions(logits_bc: jax.Array) -> jax.Array:
  """Class ids `[B]`, or the regression scores for C = 1."""
  return logits_bc[:, 0] if logits_bc.shape[-1] == 1 else jnp.argmax(logits_bc, axis=-1)


def make_predict_step(graphdef: nnx.GraphDef, placement: Placement):
  """Returns `predict(model_state, batch) -> predictions [B]` (eval mode: no dropout),
  replicated so that every process can read them."""

  @jax.jit
  def predict(state, batch):
    model = nnx.merge(graphdef, state)
    model.eval()
    logits_bc, _ = model(batch["tokens"], batch["lengths"])
    return jax.lax.with_sharding_constraint(predictions(logits_bc),
                                            parallel.replicated(placement.mesh))

  return predict


class ClassificationTask(Task):
  """Fine-tunes `method`'s trainable part of a `SequenceClassifier` over a frozen backbone."""

  name = "finetune"
  rate_name = "examples_per_second"
  experiment = ClassificationExperiment

  def __init__(self, config: ml_collections.ConfigDict):
    super().__init__(config)
    self.spec = self.typed.task.spec()
    self._trainable = methods.trainable_filter(self.typed.method)
    self.checkpoint_params = ParamsItem("trainable", self._trainable)
    self._tokenizer, self._valid, self._predict = None, None, None

  @property
  def trainable(self):
    return self._trainable

  @property
  def batch_size(self) -> int:
    return self.typed.train.batch_size

  @property
  def items_per_step(self) -> int:
    return self.typed.train.batch_size

  def flops_per_step(self, model: SequenceClassifier) -> int:
    """Counted over the frozen backbone: the backward pass from the lowest trained part."""
    return classifier_step_flops(model, self.batch_size, self.typed.task.max_len,
                                 wrt=self._trainable)

  def check_mesh(self, placement: Placement) -> None:
    placement.check_batch(self.typed.train.batch_size, "train.batch_size")
    placement.check_batch(self.typed.eval.batch_size, "eval.batch_size")
    tensor = parallel.axis_size(placement.mesh, parallel.TENSOR)
    if tensor > 1:  # The backbone's fields (its config.json, or the LM run's saved config).
      model_cfg = methods.with_method(backbones.backbone_model_config(self.typed.backbone),
                                      self.typed.method)
      check_tensor_parallel(ModelConfig.parse(model_cfg, "model"), tensor)

  def init_model_and_optimizer(self):
    return self._with_optimizer(backbones.new_classifier(self.typed, self.spec.num_classes))

  def build(self, placement: Placement):
    """Built eagerly (the backbone's weights are read from files), then placed."""
    model = backbones.build_classifier(self.typed, self.spec.num_classes)
    return placement.put(self._with_optimizer(model))

  def _with_optimizer(self, model: SequenceClassifier):
    return model, nnx.Optimizer(model, make_optimizer(self.typed.train), wrt=self._trainable)

  def batch_shapes(self) -> dict[str, jax.ShapeDtypeStruct]:
    return {**self._inputs(self.batch_size), "labels": jax.ShapeDtypeStruct(
        (self.batch_size,), jnp.float32 if self.spec.num_classes == 1 else jnp.int32)}

  def _inputs(self, batch_size: int) -> dict[str, jax.ShapeDtypeStruct]:
    """`tokens [B, max_len]` and `lengths [B]` (`task_batches`)."""
    return {"tokens": jax.ShapeDtypeStruct((batch_size, self.typed.task.max_len), jnp.int32),
            "lengths": jax.ShapeDtypeStruct((batch_size,), jnp.int32)}

  def eval_step(self, model: SequenceClassifier, placement: Placement):
    batch = placement.batch_shapes(self._inputs(self.typed.eval.batch_size))
    return make_predict_step(nnx.graphdef(model), placement), (batch,)

  def new_model(self, placement: Placement | None = None) -> SequenceClassifier:
    """Built eagerly (the backbone's weights are read from files), then placed."""
    model = backbones.build_classifier(self.typed, self.spec.num_classes)
    return model if placement is None else placement.put(model)

  def tokenized(self, split: str, n_examples: int | None,
                first: bool = False) -> dict[str, np.ndarray]:
    """A split as arrays: `tokens [N, max_len]`, `lengths [N]`, `labels [N]`."""
    loaded = classification.load_task_split(self.typed.task, split, n_examples=n_examples,
                                            seed=self.typed.seed, first=first)
    if self._tokenizer is None:
      self._tokenizer = backbones.load_tokenizer(self.typed.backbone)
    tokens, lengths = self._tokenizer.encode(loaded.texts, self.typed.task.max_len)
    return {"tokens": tokens, "lengths": lengths, "labels": loaded.labels}

  def load_data(self, placement: Placement):
    task = self.typed.task
    train = self.tokenized("train", task.n_train, first=task.n_train_from == "first")
    self._valid = self.tokenized(self.spec.eval_split, self.typed.eval.max_examples)
    return task_batches.train_iterator(train, self.batch_size, self.typed.seed,
                                       placement.local_rows(self.batch_size))

  def loss(self, model: SequenceClassifier, batch, carry):
    logits_bc, aux = model(batch["tokens"], batch["lengths"])
    loss = task_loss(logits_bc, batch["labels"])
    return loss + aux["reg_loss"], ({"task_loss": loss, **routing_health.step_metrics(aux)},
                                    carry)

  def evaluate(self, model: SequenceClassifier, placement: Placement) -> dict[str, float]:
    return self._score(model, placement, self._valid)

  def _score(self, model, placement: Placement, arrays) -> dict[str, float]:
    """The task's metrics (`spec.metrics`) of the model's predictions on `arrays`."""
    if np.all(arrays["labels"] < 0):
      raise HiddenLabelsError(f"{self.spec.name}: this split's labels are hidden (GLUE test "
                              f"splits); evaluate on {self.spec.eval_split!r} or submit "
                              "predictions to GLUE.")
    batch_size = self.typed.eval.batch_size
    if self._predict is None:  # Compiled once per run: every evaluation reuses it.
      self._predict = make_predict_step(nnx.graphdef(model), placement)
    predict = self._predict
    state, rows, preds = nnx.state(model), placement.local_rows(batch_size), []
    with jax.set_mesh(placement.mesh):
      for batch in task_batches.eval_batches(arrays, batch_size):
        weights = batch.pop("weights")
        local = {k: v[rows] for k, v in batch.items()}
        preds.append(np.asarray(predict(state, placement.global_batch(local, batch_size)))
                     [weights > 0])
    return classification_metrics.compute(self.spec.metrics, np.concatenate(preds),
                                          arrays["labels"])

  def finish(self, run, step: int) -> dict[str, float]:
    """Writes `storage.json`: the trainable parameters and their bytes on disk (one task's
    storage cost); returns the trainable parameter count."""
    n_trainable = sum(x.size for x in jax.tree.leaves(nnx.state(run.model, self._trainable)))
    n_total = sum(x.size for x in jax.tree.leaves(nnx.state(run.model, nnx.Param)))
    report = {"method": self.typed.method.kind, "trainable_params": int(n_trainable),
              "total_params": int(n_total),
              "trainable_bytes_on_disk": run.checkpointer.params_bytes(step)}
    if jax.process_index() == 0:
      with open(os.path.join(run.workdir, "storage.json"), "w", encoding="utf-8") as f:
        json.dump(report, f, indent=2)
    return {"trainable_params": report["trainable_params"]}

  def evaluate_checkpoint(self, workdir: str, step: int, split: str,
                          max_batches: int | None) -> dict:
    """Scores `split` (default: the task's validation split) with the backbone rebuilt from
    `backbone` and step `step`'s trainable part on top. `max_batches` limits the batches."""
    placement = Placement(parallel.mesh_from_config(self.typed.mesh))
    model = self.restore_model(workdir, step, placement)
    split = self.spec.eval_split if split in (None, "validation") else split
    n_examples = None if max_batches is None else max_batches * self.typed.eval.batch_size
    arrays = self.tokenized(split, None)
    if n_examples is not None:
      arrays = {k: v[:n_examples] for k, v in arrays.items()}
    return self._score(model, placement, arrays)

  def param_report(self) -> dict:
    return storage_report(backbones.backbone_model_config(self.typed.backbone),
                          self.typed.method, num_classes=self.spec.num_classes)
