"""A language model's loss and its evaluation over a whole split, carrying XL memory across
segments."""

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from tqdm import tqdm

from sparse_jax import parallel
from sparse_jax.data.lm_stream import eval_batches
from sparse_jax.models.xl_memory import XLMemory
from sparse_jax.training.placement import Placement


def cross_entropy(logits_btv: jax.Array, targets_bt: jax.Array) -> tuple[jax.Array, jax.Array]:
  """Summed token cross-entropy in nats (float32) and the number of tokens."""
  logp_btv = jax.nn.log_softmax(logits_btv.astype(jnp.float32), axis=-1)
  nll_bt = -jnp.take_along_axis(logp_btv, targets_bt[..., None], axis=-1)[..., 0]
  return nll_bt.sum(), jnp.asarray(nll_bt.size, jnp.float32)


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


def unit_metric(loss: float, unit: str) -> dict[str, float]:
  """A mean loss in nats as bits per byte (byte-level data) or perplexity (tokens)."""
  if unit == "byte":
    return {"bits_per_byte": loss / math.log(2.0)}
  return {"perplexity": math.exp(loss)}


def lm_metrics(nll_sum: float, n_tokens: float, unit: str,
               words_per_token: float | None = None) -> dict[str, float]:
  """Mean loss in nats, the token count and `unit_metric` of the loss.

  With `words_per_token` (a split's whitespace-separated words over its tokens), also the
  per-word perplexity: the same total log-likelihood divided by the number of words the
  evaluated tokens hold, `exp(nll_sum / (n_tokens * words_per_token))`. Over a whole split
  this is the split's log-likelihood over its word count, comparable with word-level results.
  """
  loss = nll_sum / n_tokens
  metrics = {"loss": loss, "tokens": int(n_tokens), **unit_metric(loss, unit)}
  if words_per_token:
    metrics["word_perplexity"] = math.exp(nll_sum / (n_tokens * words_per_token))
  return metrics


class Evaluator:
  """Evaluates models of one architecture on token arrays; compiles its step once.

  On `placement`'s mesh (default: the first device) each process reads only its own streams
  of every segment; all processes get the same metrics.
  """

  def __init__(self, model: nnx.Module, *, batch_size: int, seq_len: int, mem_len: int,
               unit: str, placement: Placement | None = None):
    self._placement = placement or Placement(parallel.make_mesh((1, 1, 1), jax.devices()[:1]))
    self._placement.check_batch(batch_size, "eval.batch_size")
    self._graphdef = nnx.graphdef(model)
    self._step = make_eval_step(self._graphdef)
    self._batch_size, self._seq_len, self._mem_len, self._unit = (
        batch_size, seq_len, mem_len, unit)

  def __call__(self, model: nnx.Module, tokens: np.ndarray, *, max_batches: int | None = None,
               progress: bool = True, words_per_token: float | None = None
               ) -> dict[str, float]:
    """Runs the whole split (or its first `max_batches` segments) from an empty memory.

    `words_per_token` adds the per-word perplexity (see `lm_metrics`).
    """
    placement, batch_size = self._placement, self._batch_size
    batches = eval_batches(tokens, batch_size, self._seq_len, max_batches,
                           placement.data_shard(batch_size))
    state = nnx.state(model)
    memory = placement.create_memory(lambda: model.init_memory(batch_size, self._mem_len))
    nll_sum, n_tokens = 0.0, 0.0
    progress = progress and jax.process_index() == 0
    with jax.set_mesh(placement.mesh):
      for batch in tqdm(batches, desc="eval", disable=not progress, leave=False):
        memory, batch_nll, batch_tokens = self._step(
            state, memory, placement.global_batch(batch, batch_size))
        nll_sum, n_tokens = nll_sum + batch_nll, n_tokens + batch_tokens
    nll_sum, n_tokens = jax.device_get((nll_sum, n_tokens))
    return lm_metrics(float(nll_sum), float(n_tokens), self._unit, words_per_token)
