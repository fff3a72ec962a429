"""Autoregressive generation with a `TransformerLM`'s decode cache, on one device or a mesh."""

import functools

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import Mesh, NamedSharding

from sparse_jax import parallel


@functools.partial(jax.jit, static_argnums=(0,), donate_argnums=(2,))
def _step(graphdef, state, cache, tokens_b1, key, temperature):
  """Feeds one token; returns the sampled next token `[B, 1]` and the new cache (the old one
  is donated: updated in place)."""
  lm = nnx.merge(graphdef, state)
  lm.eval()
  logits_b1v, cache = lm.decode_step(tokens_b1, cache)
  logits_bv = logits_b1v[:, 0].astype(jnp.float32)
  greedy_b = jnp.argmax(logits_bv, axis=-1)
  sampled_b = jax.random.categorical(key, logits_bv / jnp.maximum(temperature, 1e-6))
  next_b = jnp.where(temperature > 0, sampled_b, greedy_b).astype(tokens_b1.dtype)
  return next_b[:, None], cache


def on_mesh(lm: nnx.Module, mesh: Mesh) -> nnx.Module:
  """`lm` with every array in its sharding on `mesh` (`parallel.state_shardings`: over
  `tensor` by head, hidden unit and vocabulary). One process: every array is copied from
  this process's devices."""
  graphdef, state = nnx.split(lm)
  return nnx.merge(graphdef, jax.device_put(state, parallel.state_shardings(state, mesh)))


def generate(lm: nnx.Module, prompt_bt: jax.Array, n_tokens: int, *,
             temperature: float = 1.0, rng: jax.Array | None = None,
             mesh: Mesh | None = None) -> jax.Array:
  """Continues `prompt_bt` by `n_tokens` tokens; returns `[B, T + n_tokens]`.

  The prompt is fed one token at a time through `lm.decode_step` (the cache holds
  `T + n_tokens` positions); each new token is sampled from `softmax(logits / temperature)`,
  or taken greedily with `temperature=0`. Runs in evaluation mode (no dropout, no routing
  noise) without changing `lm` itself.

  With `mesh` (say `parallel.make_mesh((1, 1, 1, 8))`, tensor 8), the model is placed on it
  (`on_mesh`) and decodes there, each layer's weights and KV cache split over `tensor` (the
  rows over the batch axes where they divide the batch): the same tokens as one device, up
  to float32 reduction order (`tests/models/test_tensor_decoding.py`). Called inside
  `jax.set_mesh(mesh)` with a placed model, the same happens without `mesh`.
  """
  if prompt_bt.shape[1] < 1 or n_tokens < 0:
    raise ValueError(f"generate needs a non-empty prompt and n_tokens >= 0; got prompt shape "
                     f"{prompt_bt.shape}, n_tokens={n_tokens}.")
  rng = jax.random.key(0) if rng is None else rng
  if mesh is None:
    return _generate(lm, prompt_bt, n_tokens, temperature, rng)
  with jax.set_mesh(mesh):
    rows = NamedSharding(mesh, parallel.partition_spec(("batch", None), prompt_bt.shape, mesh))
    return _generate(on_mesh(lm, mesh), jax.device_put(prompt_bt, rows), n_tokens,
                     temperature, jax.device_put(rng, parallel.replicated(mesh)))


def _generate(lm, prompt_bt, n_tokens, temperature, rng):
  """`generate` on the mesh the arrays are on."""
  batch, t = prompt_bt.shape
  graphdef, state = nnx.split(lm)
  cache = lm.init_cache(batch, t + n_tokens)
  temperature = jnp.asarray(temperature, jnp.float32)
  tokens = [prompt_bt[:, i:i + 1] for i in range(t)]
  for i in range(t + n_tokens - 1):
    next_b1, cache = _step(graphdef, state, cache, tokens[i], jax.random.fold_in(rng, i),
                           temperature)
    if i + 1 >= t:
      tokens.append(next_b1)
  return jnp.concatenate(tokens, axis=1)
