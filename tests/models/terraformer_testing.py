"""Shared by the Terraformer tests: the teacher-forced loss and its gradients in training mode."""

import jax
import jax.numpy as jnp
from flax import nnx

from sparse_jax.models.rngs import reseed


def loss_and_grads(model: nnx.Module, inputs_bs: jax.Array, targets_bt: jax.Array):
  """`(loss, gradients as a pure dict)` of `model` in training mode (dropout, Gumbel noise,
  fresh LSH hashes, random position offsets), its RNG streams reseeded to one fixed key, so
  two models with the same weights draw the same randomness."""
  model.train()
  reseed(model, 0, 3)

  def loss_fn(model):
    logits, aux = model(inputs_bs, targets_bt)
    logp = jax.nn.log_softmax(logits, -1)
    return -jnp.take_along_axis(logp, targets_bt[..., None], -1).mean() + aux["reg_loss"]

  # Jitted: eager dispatch of the reversible stack's many small ops is slower than compiling.
  loss, grads = nnx.jit(nnx.value_and_grad(loss_fn))(model)
  return loss, nnx.to_pure_dict(grads)
