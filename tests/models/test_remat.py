"""`model.remat`: recomputing blocks in the backward pass gives `none`'s gradients."""

import jax
import ml_collections
import numpy as np
import pytest
from flax import nnx

from sparse_jax.models import TransformerLM
from sparse_jax.models.encoder import Encoder
from sparse_jax.models.rngs import make_rngs, reseed
from sparse_jax.models.terraformer_config import TerraformerConfig
from sparse_jax.validation import ConfigError


def lm_config(remat: str):
  """An XL sigma-MoE LM with dropout everywhere, so recomputation must redraw the masks."""
  return ml_collections.ConfigDict(dict(
      vocab_size=40, d_model=16, n_layers=2, n_heads=2, mem_len=6, dropout=0.2,
      attn_dropout=0.1, remat=remat,
      ff=dict(kind="sigma_moe", n_experts=4, expert_size=8, k=2, reg_coef=0.01,
              expert_dropout=0.1)))


def encoder_config(remat: str):
  return ml_collections.ConfigDict(dict(
      kind="encoder", vocab_size=40, d_model=16, n_layers=2, n_heads=2, max_positions=20,
      type_vocab_size=1, pad_id=1, layer_norm_eps=1e-5, dropout=0.2, attn_dropout=0.1,
      init_std=0.02, remat=remat, ff=dict(kind="dense", d_ff=32, activation="gelu")))


def _lm_loss(model, tokens_bt):
  logits, _, aux = model(tokens_bt)
  return jax.numpy.mean(logits ** 2) + aux["reg_loss"]


def _encoder_loss(model, tokens_bt):
  h_btd, aux = model(tokens_bt)
  return jax.numpy.mean(h_btd ** 2) + aux["reg_loss"]


def _grads(build, loss):
  model = build()
  model.train()
  reseed(model, 0, 3)
  tokens_bt = jax.random.randint(jax.random.key(1), (2, 7), 2, 40)
  return nnx.to_pure_dict(nnx.jit(nnx.grad(loss))(model, tokens_bt))


@pytest.mark.parametrize("remat", ["block", "dots"])
@pytest.mark.parametrize("model", ["lm", "encoder"])
def test_remat_gradients_equal_none(model, remat):
  """The same operations run twice: equal to float32 rounding (XLA may fuse the recomputed
  graph differently): rtol 1e-5, plus 1e-5 of the largest gradient for entries that are sums
  cancelling to near zero (the attention key bias's gradient is exactly 0 in exact
  arithmetic: softmax ignores a per-query constant), whose rounding is relative to their
  terms."""
  if model == "lm":
    build = lambda kind: lambda: TransformerLM(lm_config(kind), rngs=make_rngs(0))  # noqa: E731
    loss = _lm_loss
  else:
    build = lambda kind: lambda: Encoder(encoder_config(kind), rngs=make_rngs(0))  # noqa: E731
    loss = _encoder_loss
  expected = _grads(build("none"), loss)
  got = _grads(build(remat), loss)
  scale = max(np.abs(x).max() for x in jax.tree.leaves(expected))
  jax.tree.map(lambda g, e: np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-5 * scale),
               got, expected)


def test_remat_recomputes_in_the_lowered_program():
  """`block` puts each block under a checkpoint: the lowered gradient contains the block's
  forward twice, so more matmuls than without."""
  def n_dots(kind):
    model = TransformerLM(lm_config(kind), rngs=make_rngs(0))
    tokens_bt = jax.numpy.zeros((2, 7), jax.numpy.int32)
    graphdef, state = nnx.split(model)
    grad = jax.jit(lambda s: nnx.grad(_lm_loss)(nnx.merge(graphdef, s), tokens_bt))
    return grad.lower(state).as_text().count("dot_general")
  assert n_dots("block") > n_dots("none")


def test_terraformer_refuses_remat():
  with pytest.raises(ConfigError, match="model.remat.*reversible"):
    TerraformerConfig.parse(dict(vocab_size=16, d_model=32, n_heads=2, n_encoder_layers=1,
                                 n_decoder_layers=1, ff=dict(kind="dense", d_ff=64),
                                 lsh=dict(n_hashes=1, n_buckets=4, chunk_len=8),
                                 remat="block"), "model")
