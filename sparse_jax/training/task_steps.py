"""Jitted fine-tuning and prediction steps of a `SequenceClassifier`.

Gradients are taken only with respect to the trainable parameters (`nnx.DiffState` with the
method's filter) and the optimiser holds state for those only, so frozen parameters are never
touched. Dropout draws from `fold_in(key(seed), step)` as in the LM step, so a resumed run
repeats an uninterrupted one.
"""

import functools

import jax
import jax.numpy as jnp
import optax
from flax import nnx


def task_loss(logits_bc: jax.Array, labels_b: jax.Array) -> jax.Array:
  """Mean cross-entropy (C > 1 classes) or mean squared error (C = 1: regression)."""
  logits_bc = logits_bc.astype(jnp.float32)
  if logits_bc.shape[-1] == 1:
    return jnp.mean((logits_bc[:, 0] - labels_b.astype(jnp.float32)) ** 2)
  return optax.softmax_cross_entropy_with_integer_labels(logits_bc, labels_b).mean()


def predictions(logits_bc: jax.Array) -> jax.Array:
  """Class ids `[B]`, or the regression scores for C = 1."""
  return logits_bc[:, 0] if logits_bc.shape[-1] == 1 else jnp.argmax(logits_bc, axis=-1)


def make_task_train_step(graphdef: nnx.GraphDef, seed: int, trainable):
  """Returns `step(state, batch, step_index) -> (state, metrics)`; `state` is donated.

  `state` is `nnx.split((model, optimizer))[1]`; the loss is the task loss plus the model's
  `aux["reg_loss"]`; `trainable` is the NNX filter of the parameters that train.
  """
  base_key = jax.random.key(seed)

  @functools.partial(jax.jit, donate_argnums=(0,))
  def train_step(state, batch, step_index):
    model, optimizer = nnx.merge(graphdef, state)
    model.train()
    nnx.reseed(model, dropout=jax.random.fold_in(base_key, step_index))

    def loss_fn(model):
      logits_bc, aux = model(batch["tokens"], batch["lengths"])
      loss = task_loss(logits_bc, batch["labels"])
      return loss + aux["reg_loss"], loss

    (loss, task), grads = nnx.value_and_grad(
        loss_fn, argnums=nnx.DiffState(0, trainable), has_aux=True)(model)
    optimizer.update(model, grads)
    metrics = {"loss": loss, "task_loss": task, "grad_norm": optax.tree.norm(grads)}
    return nnx.state((model, optimizer)), metrics

  return train_step


def make_predict_step(graphdef: nnx.GraphDef):
  """Returns `predict(model_state, batch) -> predictions [B]` (eval mode: no dropout)."""

  @jax.jit
  def predict(state, batch):
    model = nnx.merge(graphdef, state)
    model.eval()
    logits_bc, _ = model(batch["tokens"], batch["lengths"])
    return predictions(logits_bc)

  return predict
