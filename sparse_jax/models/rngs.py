"""A model's random streams: one per purpose, all derived from one seed.

Every layer draws from named `nnx.Rngs` streams: `params` (initialisation), `dropout` and
`routing` (noisy or random routing, LSH hashes). The training step reseeds the last two from
(seed, step) every step (`reseed`), so a resumed run draws exactly what an uninterrupted one
would, without saving RNG state.

The training streams may use another PRNG implementation than JAX's threefry (`RNG_IMPLS`,
the config's `train.rng_impl`): "rbg" and "unsafe_rbg" draw bits with XLA's RngBitGenerator
instead of threefry's hash rounds, the usual lever for cheaper dropout masks (MaxText's).
`params` is always threefry, so a model's initialisation does not depend on the choice.
"""

import jax
from flax import nnx

RNG_STREAMS = ("params", "dropout", "routing")
TRAINING_STREAMS = RNG_STREAMS[1:]  # Reseeded every step, in `rng_impl`.
RNG_IMPLS = ("threefry", "rbg", "unsafe_rbg")
_JAX_IMPL = {"threefry": "threefry2x32", "rbg": "rbg", "unsafe_rbg": "unsafe_rbg"}


def root_key(seed: int, rng_impl: str = "threefry") -> jax.Array:
  """The typed key of `seed` in implementation `rng_impl` (one of `RNG_IMPLS`)."""
  return jax.random.key(seed, impl=_JAX_IMPL[rng_impl])


def make_rngs(seed: int, rng_impl: str = "threefry") -> nnx.Rngs:
  """One named stream per purpose (`RNG_STREAMS`), all from `seed`: `params` in threefry,
  the training streams in `rng_impl`, the implementation `reseed` gives them, so that the
  model's state keeps one type from step to step."""
  impls = {name: "threefry" if name == "params" else rng_impl for name in RNG_STREAMS}
  return nnx.Rngs(**{name: jax.random.fold_in(root_key(seed, impls[name]), i)
                     for i, name in enumerate(RNG_STREAMS)})


def reseed(model: nnx.Module, seed: int, step_index, micro_batch=None,
           rng_impl: str = "threefry") -> None:
  """Sets the model's `dropout` and `routing` streams to their `rng_impl` keys for step
  `step_index` (and, with gradient accumulation, for its micro-batch `micro_batch`)."""
  key = jax.random.fold_in(root_key(seed, rng_impl), step_index)
  if micro_batch is not None:
    key = jax.random.fold_in(key, micro_batch)
  nnx.reseed(model, **{name: jax.random.fold_in(key, i)
                       for i, name in enumerate(TRAINING_STREAMS)})
