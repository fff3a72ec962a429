"""Learning-rate schedules against their formulas, and config errors of the `train` section."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from sparse_jax.training.optimizer import TrainConfig, learning_rate_schedule, make_optimizer
from sparse_jax.validation import ConfigError


def train_config(**fields) -> TrainConfig:
  defaults = dict(steps=100_000, lr=0.01, log_every=1, eval_every=1, ckpt_every=1)
  return TrainConfig.parse({**defaults, **fields}, "train")


def test_rsqrt_schedule_is_trax_linear_warmup_times_rsqrt_decay():
  """Trax `multifactor('constant * linear_warmup * rsqrt_decay')` with constant = lr *
  sqrt(warmup): `constant * min(1, t / warmup) / sqrt(max(t, warmup))`."""
  warmup, lr = 10_000, 0.01
  schedule = learning_rate_schedule(train_config(schedule="rsqrt", warmup_steps=warmup, lr=lr))
  constant = lr * np.sqrt(warmup)
  for t in (0, 1, 5_000, 10_000, 40_000, 99_999):
    expected = constant * min(1.0, t / warmup) / np.sqrt(max(t, warmup))
    assert float(schedule(t)) == pytest.approx(expected, rel=1e-6)


@pytest.mark.parametrize("optimizer", ["adam", "adafactor"])
def test_each_optimizer_reduces_a_quadratic(optimizer):
  tx = make_optimizer(train_config(optimizer=optimizer, schedule="rsqrt", warmup_steps=10,
                                   lr=0.05, steps=200))
  target = jax.random.normal(jax.random.key(0), (128, 256))
  params = jnp.zeros_like(target) + 1.0
  loss = lambda p: jnp.mean((p - target) ** 2)
  state, first = tx.init(params), float(loss(params))
  for _ in range(100):
    updates, state = tx.update(jax.grad(loss)(params), state, params)
    params = optax.apply_updates(params, updates)
  assert float(loss(params)) < 0.5 * first


def test_unknown_optimizer_names_the_field_and_choices():
  with pytest.raises(ConfigError, match=r"train\.optimizer.*adam.*adafactor"):
    train_config(optimizer="sgd")
