"""Gradient accumulation (`train.grad_accum_steps`): micro-batches inside the jitted step."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from sparse_jax.models.rngs import reseed
from sparse_jax.tasks import task_for
from sparse_jax.training import steps
from sparse_jax.validation import ConfigError

BATCH, N_MICRO = 8, 4


def _task(tiny_config, ff_kind: str):
  tiny_config.data.batch_size = BATCH
  tiny_config.model.update(dropout=0.0)
  if ff_kind == "dense":
    tiny_config.model.ff = {"kind": "dense", "d_ff": 64}
  else:  # sigma-MoE with its entropy regulariser, routing noise-free (no expert dropout).
    tiny_config.model.ff.update(expert_dropout=0.0)
  return task_for(tiny_config)


def _inputs(task):
  model, _ = task.init_model_and_optimizer()
  model.train()
  tokens = jax.random.randint(jax.random.key(1), (BATCH, 17), 0, 256)
  batch = {"inputs": tokens[:, :-1], "targets": tokens[:, 1:]}
  memory = model.init_memory(BATCH)  # A memory with content, so its split matters.
  memory = memory.append(jax.random.normal(jax.random.key(2), (2, BATCH, 16, 32)))
  return model, batch, memory


def _whole_batch(task, model, batch, memory):
  reseed(model, 0, 0)
  (loss, (metrics, new_memory)), grads = nnx.jit(nnx.value_and_grad(
      task.loss, argnums=nnx.DiffState(0, nnx.Param), has_aux=True))(model, batch, memory)
  return loss, metrics, new_memory, grads


def _accumulated(task, model, batch, memory, n=N_MICRO):
  return jax.jit(lambda b, m: steps._accumulate(  # noqa: SLF001
      task.loss, model, nnx.Param, b, m, n=n, carry_rows=task, seed=0, step_index=0))(
          batch, memory)


def _rows(x, n, i, axis=0):
  """Micro-batch i's rows, independently of `split_rows`: rows i, i + n, ..."""
  return np.take(np.asarray(x), np.arange(i, x.shape[axis], n), axis=axis)


def _per_micro_batch_reference(task, model, batch, memory, n=N_MICRO):
  """Each micro-batch's loss and gradients computed on its own (a Python loop over row
  subsets), averaged: what accumulation documents."""
  results = []
  for i in range(n):
    micro_batch = jax.tree.map(lambda x: _rows(x, n, i), batch)
    micro_memory = type(memory)(_rows(memory.hidden_lbmd, n, i, axis=1), memory.valid)
    results.append(_whole_batch(task, model, micro_batch, micro_memory))
  mean = lambda *xs: sum(xs) / n  # noqa: E731
  return (mean(*[r[0] for r in results]), jax.tree.map(mean, *[r[1] for r in results]),
          [r[2] for r in results], jax.tree.map(mean, *[r[3] for r in results]))


def _assert_close(got, expected, rtol, atol):
  jax.tree.map(lambda g, e: np.testing.assert_allclose(g, e, rtol=rtol, atol=atol),
               got, expected)


def test_split_and_join_rows_are_inverse_and_interleaved():
  x = np.arange(2 * 12 * 3).reshape(2, 12, 3)
  split = steps.split_rows(jnp.asarray(x), 4, axis=1)
  assert split.shape == (4, 2, 3, 3)
  for i in range(4):
    np.testing.assert_array_equal(split[i], _rows(x, 4, i, axis=1))
  np.testing.assert_array_equal(steps.join_rows(split, axis=1), x)
  empty = jnp.zeros((2, 12, 0, 3))  # An XL memory of no positions (non-XL attention).
  assert steps.join_rows(steps.split_rows(empty, 4, axis=1), axis=1).shape == empty.shape


def test_dense_micro_batches_give_the_whole_batch_update(tiny_config):
  """A dense LM without dropout: every row's loss is independent of the other rows, so the
  mean of equal micro-batches' mean losses is the batch mean; equal to f32 rounding (sums in
  another order: rtol 1e-5 on values, absolute 1e-7 for gradients near zero)."""
  task = _task(tiny_config, "dense")
  model, batch, memory = _inputs(task)
  loss, metrics, new_memory, grads = _whole_batch(task, model, batch, memory)
  acc_loss, acc_metrics, acc_memory, acc_grads = _accumulated(task, model, batch, memory)
  _assert_close(acc_loss, loss, 1e-5, 0)
  _assert_close(acc_metrics, metrics, 1e-5, 0)
  _assert_close(acc_grads, grads, 1e-4, 1e-7)
  _assert_close(acc_memory.hidden_lbmd, new_memory.hidden_lbmd, 1e-5, 1e-6)
  assert int(acc_memory.valid) == int(new_memory.valid)


def test_sigma_moe_regulariser_is_per_micro_batch(tiny_config):
  """sigma-MoE's entropy regulariser is of the batch-averaged selection: accumulation computes
  it per micro-batch, so the step equals the mean of the micro-batches computed one by one (to
  f32 rounding), and differs from the whole batch only by the regulariser (its coefficient,
  1e-3, bounds the loss difference)."""
  task = _task(tiny_config, "sigma_moe")
  model, batch, memory = _inputs(task)
  ref_loss, ref_metrics, _, ref_grads = _per_micro_batch_reference(task, model, batch, memory)
  acc_loss, acc_metrics, _, acc_grads = _accumulated(task, model, batch, memory)
  _assert_close(acc_loss, ref_loss, 1e-5, 0)
  _assert_close(acc_metrics, ref_metrics, 1e-5, 1e-7)
  _assert_close(acc_grads, ref_grads, 1e-4, 1e-7)

  whole_loss, whole_metrics, _, _ = _whole_batch(task, model, batch, memory)
  _assert_close(acc_metrics["ce"], whole_metrics["ce"], 1e-5, 0)
  assert abs(float(acc_loss - whole_loss)) <= 1e-3 * 2 * np.log(4)  # n_layers * max entropy


@pytest.mark.parametrize("accum", [3, 16])
def test_accumulation_must_divide_the_batch(tiny_config, tmp_path, accum):
  from sparse_jax.tasks import train_and_evaluate

  tiny_config.train.grad_accum_steps = accum
  with pytest.raises(ConfigError, match="train.grad_accum_steps"):
    train_and_evaluate(tiny_config, str(tmp_path / "run"))
