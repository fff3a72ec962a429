"""The recipe study's options (issue 73): the embedding's draw scale and multiplier, the
residual outputs' init scale, the XL biases' init and Adam's betas and epsilon, each checked
against an independent computation (float64 numpy or a model with the effect built by hand)."""

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest
from flax import nnx

from sparse_jax.models import TransformerLM
from sparse_jax.training.optimizer import TrainConfig, make_optimizer
from sparse_jax.validation import ConfigError


def model_config(**overrides) -> ml_collections.ConfigDict:
  cfg = ml_collections.ConfigDict(dict(
      vocab_size=64, d_model=16, n_layers=2, n_heads=2, mem_len=8, dropout=0.0,
      ff=overrides.pop("ff", dict(kind="dense", d_ff=24))))
  cfg.update(overrides)
  return cfg


def tokens(seed, shape=(2, 8)):
  return jax.random.randint(jax.random.key(seed), shape, 0, 64)


def logits(lm, tokens_bt):
  lm.eval()
  return np.asarray(lm(tokens_bt)[0], np.float64)


def test_embed_init_scale_multiplies_the_draw():
  plain = TransformerLM(model_config(embed_init="normal"), rngs=nnx.Rngs(3))
  scaled = TransformerLM(model_config(embed_init="normal", embed_init_scale=0.25),
                         rngs=nnx.Rngs(3))
  np.testing.assert_allclose(scaled.embed.embedding[...], 0.25 * plain.embed.embedding[...],
                             rtol=1e-6)
  # Only the embedding changes: the rest of the draw is the same.
  np.testing.assert_array_equal(scaled.w_out[...], plain.w_out[...])


def test_embed_multiplier_equals_a_table_multiplied_by_hand():
  multiplied = TransformerLM(model_config(embed_multiplier=4.0), rngs=nnx.Rngs(0))
  by_hand = TransformerLM(model_config(), rngs=nnx.Rngs(0))
  by_hand.embed.embedding[...] = by_hand.embed.embedding[...] * 4.0
  x = tokens(1)
  np.testing.assert_allclose(logits(multiplied, x), logits(by_hand, x), rtol=1e-5, atol=1e-5)
  assert not np.allclose(logits(multiplied, x), logits(TransformerLM(model_config(),
                                                                     rngs=nnx.Rngs(0)), x))


def layer_norm_f64(x, scale, bias, eps):
  x = np.asarray(x, np.float64)
  mean, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
  return (x - mean) / np.sqrt(var + eps) * np.asarray(scale) + np.asarray(bias)


@pytest.mark.parametrize("ff", [dict(kind="dense", d_ff=24),
                                dict(kind="sigma_moe", n_experts=4, expert_size=8, k=2,
                                     reg_coef=0.001)])
def test_zero_residual_init_makes_every_block_the_identity(ff):
  lm = TransformerLM(model_config(residual_init_scale=0.0, ff=ff), rngs=nnx.Rngs(0))
  for block in lm.blocks:
    assert not np.any(block.attn.w_o[...]) and not np.any(block.ff.w_down[...])
  x = tokens(2)
  table = np.asarray(lm.embed.embedding[...], np.float64)
  norm = lm.final_norm
  expected = layer_norm_f64(table[np.asarray(x)], norm.scale[...], norm.bias[...],
                            norm.epsilon) @ np.asarray(lm.w_out[...], np.float64) \
      + np.asarray(lm.b_out[...])
  np.testing.assert_allclose(logits(lm, x), expected, rtol=1e-5, atol=1e-5)


def test_residual_init_scale_scales_only_the_residual_outputs():
  plain = TransformerLM(model_config(), rngs=nnx.Rngs(5))
  half = TransformerLM(model_config(residual_init_scale=0.5), rngs=nnx.Rngs(5))
  for p, h in zip(plain.blocks, half.blocks):
    np.testing.assert_allclose(h.attn.w_o[...], 0.5 * p.attn.w_o[...], rtol=1e-6)
    np.testing.assert_allclose(h.ff.w_down[...], 0.5 * p.ff.w_down[...], rtol=1e-6)
    np.testing.assert_array_equal(h.attn.w_q[...], p.attn.w_q[...])
    np.testing.assert_array_equal(h.ff.w_up[...], p.ff.w_up[...])


def test_residual_init_scale_is_refused_for_a_layer_that_names_no_residual_output():
  pkm = dict(kind="pkm", n_subkeys=4, knn=2, n_heads=1)
  with pytest.raises(ConfigError, match="model.residual_init_scale"):
    TransformerLM(model_config(residual_init_scale=0.0, ff=pkm), rngs=nnx.Rngs(0))


def test_xl_bias_init_std_draws_the_biases():
  lm = TransformerLM(model_config(xl_bias_init_std=0.5, n_heads=4, d_model=64),
                     rngs=nnx.Rngs(0))
  u, v = (np.asarray(b[...], np.float64) for b in (lm.blocks[0].attn.u_bias,
                                                    lm.blocks[0].attn.v_bias))
  assert u.std() == pytest.approx(0.5, rel=0.2) and v.std() == pytest.approx(0.5, rel=0.2)
  assert not np.allclose(u, v)
  zeros = TransformerLM(model_config(), rngs=nnx.Rngs(0))
  assert not np.any(zeros.blocks[0].attn.u_bias[...])
  with pytest.raises(ConfigError, match="model.xl_bias_init_std"):
    TransformerLM(model_config(xl_bias_init_std=0.1, attention="causal", mem_len=0),
                  rngs=nnx.Rngs(0))


def test_adam_betas_and_epsilon_reach_the_update():
  cfg = TrainConfig.parse(dict(steps=10, lr=0.1, log_every=1, eval_every=1,
                               ckpt_every=1, adam_b1=0.5, adam_b2=0.75, adam_eps=0.3), "train")
  optimizer = make_optimizer(cfg)
  rng = np.random.default_rng(0)
  params = {"w": jnp.asarray(rng.normal(size=5), jnp.float32)}
  grads = [rng.normal(size=5) for _ in range(2)]
  state = optimizer.init(params)
  m = v = np.zeros(5)
  for t, g in enumerate(grads, start=1):  # Kingma & Ba, Algorithm 1, in float64.
    updates, state = optimizer.update({"w": jnp.asarray(g, jnp.float32)}, state, params)
    m, v = 0.5 * m + 0.5 * g, 0.75 * v + 0.25 * g * g
    m_hat, v_hat = m / (1 - 0.5 ** t), v / (1 - 0.75 ** t)
    lr = float(optax.cosine_decay_schedule(0.1, 10)(t - 1))
    np.testing.assert_allclose(updates["w"], -lr * m_hat / (np.sqrt(v_hat) + 0.3), rtol=1e-5)


def test_adam_options_are_refused_with_adafactor():
  with pytest.raises(ConfigError, match="train.optimizer"):
    TrainConfig.parse(dict(steps=10, lr=0.1, log_every=1, eval_every=1, ckpt_every=1,
                           optimizer="adafactor", adam_b2=0.95), "train")
