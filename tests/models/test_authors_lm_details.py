"""The sigma-MoE authors' Transformer-XL details (`sparse_jax/configs/paper_training.py`), each checked
against an independent computation, and the paper configs that set them."""

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from flax import nnx

from sparse_jax.configs import default, moe_variants, sigma_moe_paper
from sparse_jax.layers import build_ff
from sparse_jax.layers.xl_attention import RelativeMultiHeadAttention
from sparse_jax.models import TransformerLM


def model_config(**overrides) -> ml_collections.ConfigDict:
  cfg = ml_collections.ConfigDict(dict(
      vocab_size=300, d_model=24, n_layers=2, n_heads=3, mem_len=8, dropout=0.0,
      ff=dict(kind="dense", d_ff=40)))
  cfg.update(overrides)
  return cfg


def tokens(seed, shape=(2, 8)):
  return jax.random.randint(jax.random.key(seed), shape, 0, 300)


def test_xavier_embedding_has_the_xavier_uniform_range_and_std():
  lm = TransformerLM(model_config(embed_init="xavier"), rngs=nnx.Rngs(0))
  table = np.asarray(lm.embed.embedding[...], np.float64)
  bound = np.sqrt(6 / (300 + 24))  # Glorot & Bengio: U(-b, b), b = sqrt(6 / (fan_in + fan_out))
  assert np.abs(table).max() <= bound and np.abs(table).max() > 0.95 * bound
  assert table.std() == pytest.approx(bound / np.sqrt(3), rel=0.05)
  default = TransformerLM(model_config(), rngs=nnx.Rngs(0))  # "fan_in": N(0, 1 / d_model)
  assert np.asarray(default.embed.embedding[...]).std() == pytest.approx(1 / np.sqrt(24),
                                                                          rel=0.05)
  normal = TransformerLM(model_config(embed_init="normal"), rngs=nnx.Rngs(0))
  assert np.asarray(normal.embed.embedding[...]).std() == pytest.approx(1.0, rel=0.05)


def test_output_dropout_drops_the_final_hidden_states_in_training_only():
  lm = TransformerLM(model_config(dropout=0.5, output_dropout=True), rngs=nnx.Rngs(0))
  lm.eval()
  clean, _, _ = lm.hidden_states(tokens(1))
  lm.train()
  dropped, _, _ = lm.hidden_states(tokens(1))
  # Every other dropout of the model is active too; the output dropout is the last op, so
  # an entry is either exactly 0 or unscaled-by-LayerNorm-output / (1 - rate).
  zero = np.asarray(dropped) == 0
  assert 0.4 < zero.mean() < 0.6
  without = TransformerLM(model_config(dropout=0.5), rngs=nnx.Rngs(0))
  without.train()
  assert (np.asarray(without.hidden_states(tokens(1))[0]) == 0).mean() < 0.01
  assert clean.shape == dropped.shape


@pytest.mark.parametrize("eps", [1e-6, 1e-5])
def test_layer_norm_epsilon_reaches_every_norm(eps):
  lm = TransformerLM(model_config(layer_norm_eps=eps), rngs=nnx.Rngs(0))
  norms = [lm.final_norm] + [n for b in lm.blocks for n in (b.attn_norm, b.ff_norm)]
  assert {n.epsilon for n in norms} == {eps}
  x = jax.random.normal(jax.random.key(0), (5, 24)) * 1e-3  # variance ~ eps: eps matters
  x64 = np.asarray(x, np.float64)
  centred = x64 - x64.mean(-1, keepdims=True)
  want = centred / np.sqrt(centred.var(-1, keepdims=True) + eps)
  np.testing.assert_allclose(np.asarray(lm.final_norm(x)), want, rtol=2e-4, atol=1e-5)


def test_learned_attention_scale_equals_scaling_queries_and_biases():
  """`(q + u) . k * c / sqrt(Dh)` = `(c q + c u) . k / sqrt(Dh)`: a learned scale c times
  the fixed one equals the fixed-scale attention with W_q, u and v multiplied by c."""
  learned = RelativeMultiHeadAttention(12, 3, 4, n_layers=2, learned_scale=True,
                                       rngs=nnx.Rngs(0))
  fixed = RelativeMultiHeadAttention(12, 3, 4, n_layers=2, rngs=nnx.Rngs(0))
  assert float(learned.scale[...]) == pytest.approx(0.5)  # 1 / sqrt(head_dim 4)
  c = 1.7
  learned.scale[...] = learned.scale[...] * c
  for name in ("u_bias", "v_bias"):
    getattr(fixed, name)[...] = jax.random.normal(jax.random.key(len(name)), (3, 4))
    getattr(learned, name)[...] = getattr(fixed, name)[...]
  fixed.w_q[...] = fixed.w_q[...] * c
  fixed.u_bias[...] = fixed.u_bias[...] * c
  fixed.v_bias[...] = fixed.v_bias[...] * c
  ctx = jax.random.normal(jax.random.key(3), (2, 9, 12))
  mem_valid = jnp.asarray(3)
  np.testing.assert_allclose(learned(ctx, 5, mem_valid), fixed(ctx, 5, mem_valid),
                             rtol=1e-5, atol=1e-6)
  grad = nnx.grad(lambda m: jnp.sum(m(ctx, 5, mem_valid) ** 2))(learned)
  assert abs(float(grad["scale"][...])) > 0


def test_topk_after_dropout_keeps_the_k_largest_dropped_out_units():
  cfg = dict(kind="topk", d_ff=40, k=6, dropout=0.5, after_dropout=True)
  layer = build_ff(cfg, d_model=12, n_layers=2, rngs=nnx.Rngs(0))
  pre = jax.random.normal(jax.random.key(1), (9, 40))
  twin = nnx.clone(layer)  # the same dropout stream: the mask the layer is about to draw
  dropped = np.asarray(twin.dropout(jax.nn.relu(pre)), np.float64)
  got = np.asarray(layer.hidden(pre), np.float64)
  want = np.zeros_like(dropped)
  for n, row in enumerate(dropped):
    keep = np.argsort(-row, kind="stable")[:6]
    want[n, keep] = row[keep]
  np.testing.assert_allclose(got, want, rtol=1e-6)
  survivors = np.count_nonzero(dropped, axis=1)  # 6 kept unless fewer units survive
  np.testing.assert_array_equal(np.count_nonzero(got, axis=1), np.minimum(6, survivors))
  before = build_ff({**cfg, "after_dropout": False}, d_model=12, n_layers=2, rngs=nnx.Rngs(0))
  assert np.count_nonzero(np.asarray(before.hidden(pre))) < 0.75 * 9 * 6


def test_paper_configs_use_the_authors_details_and_our_default_does_not():
  for model in sigma_moe_paper.MODELS:
    for config in (sigma_moe_paper.get_config(model),
                   moe_variants.get_config(f"{model},topk")):
      m = config.model
      assert (m.embed_init, m.output_dropout, m.layer_norm_eps, m.attn_scale) == (
          "xavier", True, 1e-5, "learned")
      assert config.eval.batch_size == 4
  assert moe_variants.get_config("wt103_s,topk").model.ff.after_dropout
  assert "embed_init" not in default.get_config().model
