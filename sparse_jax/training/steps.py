"""The step factory: one pure, jitted training step for every task.

A task supplies its loss, `loss_fn(model, batch, carry) -> (loss, (metrics, new_carry))`,
where `carry` is state threaded from step to step (a language model's XL memory; None for
classification), and a `wrt` filter naming the parameters that train. The step takes
gradients with respect to those parameters only, so frozen ones are never touched.

Randomness is a function of (seed, step): each step reseeds every stream but `params`
(`dropout`, `routing`) from `fold_in(key(seed), step)`, so a resumed run draws exactly what an
uninterrupted one would, without saving RNG state.
"""

import functools
from collections.abc import Callable

import jax
import optax
from flax import nnx

RNG_STREAMS = ("params", "dropout", "routing")

LossFn = Callable[..., tuple[jax.Array, tuple[dict[str, jax.Array], object]]]


def make_rngs(seed: int) -> nnx.Rngs:
  """One named stream per purpose (params, dropout, routing), all from `seed`."""
  return nnx.Rngs(**{name: jax.random.fold_in(jax.random.key(seed), i)
                     for i, name in enumerate(RNG_STREAMS)})


def reseed(model: nnx.Module, seed: int, step_index) -> None:
  """Sets the model's `dropout` and `routing` streams to their keys for step `step_index`."""
  key = jax.random.fold_in(jax.random.key(seed), step_index)
  nnx.reseed(model, **{name: jax.random.fold_in(key, i)
                       for i, name in enumerate(RNG_STREAMS[1:])})


def make_train_step(graphdef: nnx.GraphDef, loss_fn: LossFn, *, seed: int, wrt=nnx.Param,
                    out_shardings=None):
  """Returns `step(state, carry, batch, step_index) -> (state, carry, metrics)`.

  `state` is `nnx.split((model, optimizer))[1]`; it and the carry are donated. The metrics are
  `loss`, the task's own metrics and `grad_norm` (of the trainable parameters' gradients).
  On a mesh, `out_shardings` (state's, carry's, the metrics') keeps the new state where the
  old one was.
  """

  @functools.partial(jax.jit, donate_argnums=(0, 1), out_shardings=out_shardings)
  def train_step(state, carry, batch, step_index):
    model, optimizer = nnx.merge(graphdef, state)
    model.train()
    reseed(model, seed, step_index)
    (loss, (metrics, new_carry)), grads = nnx.value_and_grad(
        loss_fn, argnums=nnx.DiffState(0, wrt), has_aux=True)(model, batch, carry)
    optimizer.update(model, grads)
    metrics = {"loss": loss, **metrics, "grad_norm": optax.tree.norm(grads)}
    return nnx.state((model, optimizer)), new_carry, metrics

  return train_step
