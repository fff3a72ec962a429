"""The model's random streams (`models.rngs`) and their PRNG implementation
(`train.rng_impl`): threefry as before, rbg and unsafe_rbg for cheaper dropout masks."""

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from flax import nnx

from sparse_jax.models.rngs import RNG_IMPLS, make_rngs, reseed
from sparse_jax.tasks.lm import build_model
from sparse_jax.training import resume_config
from sparse_jax.training.optimizer import TrainConfig
from sparse_jax.validation import ConfigError

RATE, N = 0.3, 200_000  # Binomial sd of the dropped fraction: sqrt(0.3 * 0.7 / N) ~ 0.001.
FAST_IMPLS = ("rbg", "unsafe_rbg")


class Dropped(nnx.Module):
  """One dropout layer on its own: `model()` is the keep mask of N units."""

  def __init__(self, rngs: nnx.Rngs):
    self.dropout = nnx.Dropout(RATE, rngs=rngs)

  def __call__(self) -> jax.Array:
    return self.dropout(jnp.ones(N)) != 0


def mask(rng_impl: str, seed: int, step: int, micro_batch=None) -> np.ndarray:
  model = Dropped(make_rngs(seed, rng_impl))
  reseed(model, seed, step, micro_batch, rng_impl)
  return np.asarray(model())


def test_default_masks_are_those_of_threefry_keys_built_directly():
  """The default draws what the code before `rng_impl` drew: `dropout` reseeded to
  `fold_in(fold_in(key(seed), step), 0)` of JAX's threefry."""
  for seed, step in [(0, 0), (0, 7), (3, 7)]:
    direct = Dropped(nnx.Rngs(dropout=jax.random.fold_in(jax.random.key(seed), 1)))
    nnx.reseed(direct, dropout=jax.random.fold_in(
        jax.random.fold_in(jax.random.key(seed, impl="threefry2x32"), step), 0))
    np.testing.assert_array_equal(mask("threefry", seed, step), np.asarray(direct()))


def test_default_streams_are_threefry_keys_of_the_seed():
  rngs = make_rngs(5)
  for i, name in enumerate(["params", "dropout", "routing"]):
    expected = jax.random.fold_in(jax.random.key(5, impl="threefry2x32"), i)
    np.testing.assert_array_equal(jax.random.key_data(rngs[name].key[...]),
                                  jax.random.key_data(expected))


def is_impl(key: jax.Array, jax_impl: str) -> bool:
  """Whether `key` is of JAX's implementation `jax_impl` (`key_impl` returns a name or a
  spec depending on the JAX version; both compare equal for equal implementations)."""
  return jax.random.key_impl(key) == jax.random.key_impl(jax.random.key(0, impl=jax_impl))


@pytest.mark.parametrize("rng_impl", RNG_IMPLS)
def test_params_stay_threefry_and_training_streams_take_the_impl(rng_impl):
  rngs = make_rngs(0, rng_impl)
  expected = "threefry2x32" if rng_impl == "threefry" else rng_impl
  assert is_impl(rngs.params.key[...], "threefry2x32")
  assert is_impl(rngs.routing.key[...], expected)
  model = Dropped(rngs)
  reseed(model, 0, 4, rng_impl=rng_impl)
  assert is_impl(model.dropout.rngs.key[...], expected)


@pytest.mark.parametrize("rng_impl", FAST_IMPLS)
def test_fast_impls_drop_at_the_configured_rate(rng_impl):
  sd = np.sqrt(RATE * (1 - RATE) / N)
  for step in range(3):
    dropped = 1 - mask(rng_impl, 0, step).mean()
    assert abs(dropped - RATE) < 5 * sd, (step, dropped)


@pytest.mark.parametrize("rng_impl", FAST_IMPLS)
def test_fast_impl_masks_are_a_function_of_seed_step_and_micro_batch(rng_impl):
  first = mask(rng_impl, 0, 1)
  np.testing.assert_array_equal(mask(rng_impl, 0, 1), first)  # A fresh model, as on resume.
  for other in [mask(rng_impl, 0, 2), mask(rng_impl, 1, 1), mask(rng_impl, 0, 1, 0),
                mask(rng_impl, 0, 1, 1)]:
    assert (other != first).mean() > 0.3  # Independent masks differ in 2 * 0.3 * 0.7.
  np.testing.assert_array_equal(mask(rng_impl, 0, 1, 1), mask(rng_impl, 0, 1, 1))
  assert (mask(rng_impl, 0, 1) != mask("threefry", 0, 1)).mean() > 0.3


@pytest.mark.parametrize("rng_impl", FAST_IMPLS)
def test_initialisation_does_not_depend_on_the_impl(tiny_config, rng_impl):
  """The LM's parameters (every layer, routers included) come from `params` alone."""
  default = nnx.state(build_model(tiny_config), nnx.Param)
  tiny_config.train.rng_impl = rng_impl
  chosen = nnx.state(build_model(tiny_config), nnx.Param)
  jax.tree.map(np.testing.assert_array_equal, chosen, default)


def _train_section(**fields):
  return ml_collections.ConfigDict(dict(steps=2, lr=1.0, log_every=1, eval_every=1,
                                        ckpt_every=1, **fields))


def test_an_unknown_impl_is_refused_naming_the_field_and_the_choices():
  with pytest.raises(ConfigError, match=r"train\.rng_impl.*threefry.*rbg.*unsafe_rbg"):
    TrainConfig.parse(_train_section(rng_impl="philox4x32"), "train")
  assert TrainConfig.parse(_train_section(), "train").rng_impl == "threefry"


def test_a_run_does_not_resume_with_another_impl():
  """Another PRNG draws other masks from the same (seed, step), as another seed would."""
  saved = {"train": {"rng_impl": "threefry"}}
  with pytest.raises(ConfigError, match="train.rng_impl"):
    resume_config.check_resumable(saved, {"train": {"rng_impl": "rbg"}}, workdir="w", step=1)
