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


@pytest.mark.parametrize("optimizer", ["adam", "adafactor"])
def test_weight_decay_is_trax_rule_not_scaled_by_the_learning_rate(optimizer):
  """Trax: `new_w = (1 - r) w - subtrahend`. With the learning rate at zero the update is
  zero and `w` shrinks by exactly `(1 - r)^N` after N steps; with a learning rate each step
  is `(1 - r) w` plus the undecayed optimiser's own update from the same state."""
  rate, n = 1e-3, 7
  w = {"kernel": jax.random.normal(jax.random.key(0), (16, 8)),
       "bias": jax.random.normal(jax.random.key(1), (8,))}
  grads = jax.tree.map(lambda x: jnp.sin(3 * x) + 0.5, w)
  zero_lr = make_optimizer(train_config(optimizer=optimizer, lr=1e-30, weight_decay=rate,
                                        schedule="rsqrt", warmup_steps=0))
  params, state = w, zero_lr.init(w)
  for _ in range(n):
    updates, state = zero_lr.update(grads, state, params)
    params = optax.apply_updates(params, updates)
  for name in w:
    np.testing.assert_allclose(params[name], np.asarray(w[name], np.float64) * (1 - rate) ** n,
                               rtol=1e-6)
  cfg = dict(optimizer=optimizer, lr=0.01, grad_clip=1.0, schedule="rsqrt", warmup_steps=0)
  decayed, plain = (make_optimizer(train_config(weight_decay=r, **cfg)) for r in (rate, 0.0))
  decayed_state, plain_state = decayed.init(w), plain.init(w)
  for _ in range(3):
    u_decayed, decayed_state = decayed.update(grads, decayed_state, w)
    u_plain, plain_state = plain.update(grads, plain_state, w)
    for name in w:
      expected = (1 - rate) * np.asarray(w[name], np.float64) + np.asarray(u_plain[name])
      np.testing.assert_allclose(optax.apply_updates(w, u_decayed)[name], expected,
                                 rtol=1e-6, atol=1e-7)
    w = optax.apply_updates(w, u_decayed)


def test_unknown_optimizer_names_the_field_and_choices():
  with pytest.raises(ConfigError, match=r"train\.optimizer.*adam.*adafactor"):
    train_config(optimizer="sgd")


def test_adamw_is_pytorchs_adamw_in_float64_numpy():
  """torch.optim.AdamW (its documented algorithm): `w <- w - lr_t wd w`, then Adam's
  bias-corrected step; lr_t the schedule's (cosine to `end_lr_fraction * lr`)."""
  lr, wd, eps, steps = 0.01, 0.05, 1e-8, 5
  cfg = train_config(optimizer="adamw", lr=lr, weight_decay=wd, steps=steps,
                     end_lr_fraction=0.1)
  tx, schedule = make_optimizer(cfg), learning_rate_schedule(cfg)
  w = jax.random.normal(jax.random.key(0), (6, 5))
  w64, m, v = np.asarray(w, np.float64), 0.0, 0.0
  state = tx.init(w)
  for t in range(steps):
    g = jnp.cos(2 * w) + 0.3
    updates, state = tx.update(g, state, w)
    w = optax.apply_updates(w, updates)
    g64, lr_t = np.cos(2 * w64) + 0.3, float(schedule(t))
    w64 = w64 - lr_t * wd * w64
    m, v = 0.9 * m + 0.1 * g64, 0.999 * v + 0.001 * g64 ** 2
    m_hat, v_hat = m / (1 - 0.9 ** (t + 1)), v / (1 - 0.999 ** (t + 1))
    w64 = w64 - lr_t * m_hat / (np.sqrt(v_hat) + eps)
  np.testing.assert_allclose(w, w64, rtol=1e-5, atol=1e-6)


def test_cosine_ends_at_its_end_fraction():
  cfg = train_config(lr=0.02, steps=1000, warmup_steps=100, end_lr_fraction=0.1)
  schedule = learning_rate_schedule(cfg)
  for t in (100, 550, 1000):
    progress = (t - 100) / 900
    expected = 0.002 + (0.02 - 0.002) * 0.5 * (1 + np.cos(np.pi * progress))
    assert float(schedule(t)) == pytest.approx(expected, rel=1e-5)
  with pytest.raises(ConfigError, match=r"train\.end_lr_fraction"):
    train_config(schedule="linear", end_lr_fraction=0.1)


@pytest.mark.parametrize("schedule", ["cosine", "linear"])
def test_a_short_run_of_a_longer_schedule_follows_that_schedule(schedule):
  """`schedule_steps` past `steps`: the first 1000 steps of a 4000-step run, rate for rate."""
  short = learning_rate_schedule(train_config(schedule=schedule, lr=1e-3, steps=1000,
                                              schedule_steps=4000, warmup_steps=400))
  full = learning_rate_schedule(train_config(schedule=schedule, lr=1e-3, steps=4000,
                                             warmup_steps=400))
  for t in (0, 200, 400, 700, 1000):
    assert float(short(t)) == pytest.approx(float(full(t)), rel=1e-6)
  progress = (1000 - 400) / 3600  # by hand: the decay's progress at step 1000
  expected = (0.5 * (1 + np.cos(np.pi * progress)) if schedule == "cosine"
              else 1 - progress) * 1e-3
  assert float(short(1000)) == pytest.approx(expected, rel=1e-5)
  with pytest.raises(ConfigError, match=r"train\.schedule_steps"):
    train_config(steps=1000, schedule_steps=999)
