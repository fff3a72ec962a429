"""The pure, jitted training and evaluation steps over `nnx.split` state.

Randomness is a function of (seed, step): each step reseeds the model's `dropout` and `routing`
streams from `fold_in(key(seed), step)`, so a resumed run draws exactly what an uninterrupted
one would, without saving RNG state.
"""

import functools

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from sparse_jax.models.xl_memory import XLMemory

RNG_STREAMS = ("params", "dropout", "routing")


def make_rngs(seed: int) -> nnx.Rngs:
  """One named stream per purpose (params, dropout, routing), all from `seed`."""
  return nnx.Rngs(**{name: jax.random.fold_in(jax.random.key(seed), i)
                     for i, name in enumerate(RNG_STREAMS)})


def cross_entropy(logits_btv: jax.Array, targets_bt: jax.Array) -> tuple[jax.Array, jax.Array]:
  """Summed token cross-entropy in nats (float32) and the number of tokens."""
  logp_btv = jax.nn.log_softmax(logits_btv.astype(jnp.float32), axis=-1)
  nll_bt = -jnp.take_along_axis(logp_btv, targets_bt[..., None], axis=-1)[..., 0]
  return nll_bt.sum(), jnp.asarray(nll_bt.size, jnp.float32)


def make_train_step(graphdef: nnx.GraphDef, seed: int, out_shardings=None):
  """Returns `step(state, memory, batch, step_index) -> (state, memory, metrics)`.

  `state` is `nnx.split((model, optimizer))[1]`; it and the memory are donated. The loss is
  the mean cross-entropy plus the model's `aux["reg_loss"]`. On a mesh, `out_shardings`
  (state's, memory's, the metrics') keeps the new state where the old one was.
  """
  base_key = jax.random.key(seed)

  @functools.partial(jax.jit, donate_argnums=(0, 1), out_shardings=out_shardings)
  def train_step(state, memory: XLMemory, batch, step_index):
    model, optimizer = nnx.merge(graphdef, state)
    model.train()
    key = jax.random.fold_in(base_key, step_index)
    nnx.reseed(model, dropout=jax.random.fold_in(key, 0), routing=jax.random.fold_in(key, 1))

    def loss_fn(model):
      logits, new_memory, aux = model(batch["inputs"], memory)
      nll_sum, n_tokens = cross_entropy(logits, batch["targets"])
      ce = nll_sum / n_tokens
      return ce + aux["reg_loss"], (ce, aux["reg_loss"], new_memory)

    (loss, (ce, reg_loss, new_memory)), grads = nnx.value_and_grad(
        loss_fn, has_aux=True)(model)
    optimizer.update(model, grads)
    metrics = {"loss": loss, "ce": ce, "reg_loss": reg_loss,
               "grad_norm": optax.tree.norm(grads)}
    return nnx.state((model, optimizer)), new_memory, metrics

  return train_step


def make_eval_step(graphdef: nnx.GraphDef):
  """Returns `step(params_state, memory, batch) -> (memory, nll_sum, n_tokens)` (no dropout).

  `graphdef`/`params_state` come from `nnx.split(model)`.
  """

  @functools.partial(jax.jit, donate_argnums=(1,))
  def eval_step(state, memory: XLMemory, batch):
    model = nnx.merge(graphdef, state)
    model.eval()
    logits, new_memory, _ = model(batch["inputs"], memory)
    nll_sum, n_tokens = cross_entropy(logits, batch["targets"])
    return new_memory, nll_sum, n_tokens

  return eval_step
