"""The step factory: one pure, jitted training step for every task.

A task supplies its loss, `loss_fn(model, batch, carry) -> (loss, (metrics, new_carry))`,
where `carry` is state threaded from step to step (a language model's XL memory; None for
classification), and a `wrt` filter naming the parameters that train. The step takes
gradients with respect to those parameters only, so frozen ones are never touched.

Randomness is a function of (seed, step): each step reseeds every stream but `params`
(`dropout`, `routing`) from `fold_in(key(seed), step)` (`models.rngs.reseed`), so a resumed
run draws exactly what an uninterrupted one would, without saving RNG state. The keys are of
the config's `train.rng_impl` (threefry, or the cheaper rbg / unsafe_rbg).
"""

import functools
from collections.abc import Callable
from typing import Protocol

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from sparse_jax.models.rngs import reseed

LossFn = Callable[..., tuple[jax.Array, tuple[dict[str, jax.Array], object]]]


def split_rows(x: jax.Array, n: int, axis: int = 0) -> jax.Array:
  """`x` with its batch axis `axis` split into `n` micro-batches on a new leading axis,
  interleaved (micro-batch i holds rows i, i + n, ...), so that a batch sharded in contiguous
  blocks over devices gives every device its share of every micro-batch."""
  x = jnp.moveaxis(x, axis, 0)
  x_nb = x.reshape(x.shape[0] // n, n, *x.shape[1:]).swapaxes(0, 1)
  return jnp.moveaxis(x_nb, 1, axis + 1)


def join_rows(x: jax.Array, axis: int = 0) -> jax.Array:
  """The inverse of `split_rows(x, n, axis)`."""
  x_bn = jnp.moveaxis(x, axis + 1, 1).swapaxes(0, 1)
  return jnp.moveaxis(x_bn.reshape(x_bn.shape[0] * x_bn.shape[1], *x_bn.shape[2:]), 0, axis)


class CarryRows(Protocol):
  """How a task's carry splits into micro-batches along its batch axis and joins back."""

  def split_carry(self, carry, n: int): ...

  def join_carry(self, carry_n): ...


def _accumulate(loss_fn: LossFn, model: nnx.Module, wrt, batch, carry, *, n: int,
                carry_rows: CarryRows, seed: int, step_index, rng_impl: str = "threefry"):
  """Loss, metrics, new carry and gradients of `batch` as `n` micro-batches (a `lax.scan`,
  so one micro-batch's activations are alive at a time): the means over micro-batches of each
  micro-batch's loss, metrics and gradients, which for a loss that is a mean over equally
  sized micro-batches is the whole batch's. Each micro-batch draws its own dropout and
  routing noise, and continues its own rows of the carry."""
  graphdef, diff, rest = nnx.split(model, wrt, ...)

  def micro_loss(diff, micro_batch, micro_carry, micro):
    micro_model = nnx.merge(graphdef, diff, rest, copy=True)
    reseed(micro_model, seed, step_index, micro, rng_impl)
    return loss_fn(micro_model, micro_batch, micro_carry)

  value_and_grad = jax.value_and_grad(micro_loss, has_aux=True)
  xs = (jax.tree.map(lambda x: split_rows(x, n), batch), carry_rows.split_carry(carry, n),
        jnp.arange(n))
  first = jax.tree.map(lambda x: x[0], xs)
  (_, (metrics_shapes, _)), _ = jax.eval_shape(value_and_grad, diff, *first)

  def body(sums, xs_i):
    (loss, (metrics, new_carry)), grads = value_and_grad(diff, *xs_i)
    return jax.tree.map(jnp.add, sums, (loss, metrics, grads)), new_carry

  zeros = jax.tree.map(lambda x: jnp.zeros(x.shape, x.dtype),
                       (jax.ShapeDtypeStruct((), jnp.float32), metrics_shapes, diff))
  sums, new_carry_n = jax.lax.scan(body, zeros, xs)
  loss, metrics, grads = jax.tree.map(lambda total: total / n, sums)
  return loss, metrics, carry_rows.join_carry(new_carry_n), grads


def make_train_step(graphdef: nnx.GraphDef, loss_fn: LossFn, *, seed: int,
                    rng_impl: str = "threefry", wrt=nnx.Param, out_shardings=None,
                    accum_steps: int = 1, carry_rows: CarryRows | None = None):
  """Returns `step(state, carry, batch, step_index) -> (state, carry, metrics)`.

  `state` is `nnx.to_pure_dict(nnx.split((model, optimizer))[1])`: nested dicts of arrays,
  which JAX flattens and rebuilds in C++ on every call, where an `nnx.State` of Variables
  goes through Python for each Variable (a call carrying WT-103 S's 886 arrays took 1.7x the
  host time: `benchmarks/step_dispatch.py`); `nnx.merge` and `nnx.update` take it as it is.
  It and the carry are donated. The metrics are `loss`, the task's own metrics and
  `grad_norm` (of the trainable parameters' gradients).
  On a mesh, `out_shardings` (state's, carry's, the metrics') keeps the new state where the
  old one was. With `accum_steps` N > 1 the batch is taken as N micro-batches whose gradients
  are averaged before the one update (`_accumulate`); `carry_rows` (the task) splits the
  carry with them. `rng_impl` is the PRNG implementation of the reseeded streams
  (`models.rngs.RNG_IMPLS`); the model's streams must have been made in it (`make_rngs`).
  """
  if accum_steps > 1 and carry_rows is None:
    raise ValueError("gradient accumulation needs carry_rows to split the carry")

  @functools.partial(jax.jit, donate_argnums=(0, 1), out_shardings=out_shardings)
  def train_step(state, carry, batch, step_index):
    model, optimizer = nnx.merge(graphdef, state)
    model.train()
    if accum_steps == 1:
      reseed(model, seed, step_index, rng_impl=rng_impl)
      (loss, (metrics, new_carry)), grads = nnx.value_and_grad(
          loss_fn, argnums=nnx.DiffState(0, wrt), has_aux=True)(model, batch, carry)
    else:
      loss, metrics, new_carry, grads = _accumulate(
          loss_fn, model, wrt, batch, carry, n=accum_steps, carry_rows=carry_rows, seed=seed,
          rng_impl=rng_impl, step_index=step_index)
    optimizer.update(model, grads)
    metrics = {"loss": loss, **metrics, "grad_norm": optax.tree.norm(grads)}
    return nnx.to_pure_dict(nnx.state((model, optimizer))), new_carry, metrics

  return train_step
