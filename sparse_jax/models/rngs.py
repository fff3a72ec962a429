"""A model's random streams: one per purpose, all derived from one seed.

Every layer draws from named `nnx.Rngs` streams: `params` (initialisation), `dropout` and
`routing` (noisy or random routing, LSH hashes). The training step reseeds the last two from
(seed, step) every step (`reseed`), so a resumed run draws exactly what an uninterrupted one
would, without saving RNG state.
"""

import jax
from flax import nnx

RNG_STREAMS = ("params", "dropout", "routing")


def make_rngs(seed: int) -> nnx.Rngs:
  """One named stream per purpose (`RNG_STREAMS`), all from `seed`."""
  return nnx.Rngs(**{name: jax.random.fold_in(jax.random.key(seed), i)
                     for i, name in enumerate(RNG_STREAMS)})


def reseed(model: nnx.Module, seed: int, step_index, micro_batch=None) -> None:
  """Sets the model's `dropout` and `routing` streams to their keys for step `step_index`
  (and, with gradient accumulation, for its micro-batch `micro_batch`)."""
  key = jax.random.fold_in(jax.random.key(seed), step_index)
  if micro_batch is not None:
    key = jax.random.fold_in(key, micro_batch)
  nnx.reseed(model, **{name: jax.random.fold_in(key, i)
                       for i, name in enumerate(RNG_STREAMS[1:])})
