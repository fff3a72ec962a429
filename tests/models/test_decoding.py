"""Decoding: `decode_step` reproduces the full forward pass; `generate` samples from it."""

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from flax import nnx
from lm_testing import decode_all

import sparse_jax
from sparse_jax.models import TransformerLM

FFS = {
    "dense": dict(kind="dense", d_ff=48),
    "sparse_ff": dict(kind="sparse_ff", d_ff=48, block_size=8),
    "sigma_moe": dict(kind="sigma_moe", n_experts=4, expert_size=8, k=2, reg_coef=0.001),
}


def lm_config(attention, ff, **overrides):
  cfg = ml_collections.ConfigDict(dict(
      vocab_size=32, d_model=16, n_layers=2, n_heads=4, mem_len=4, dropout=0.1,
      attention=attention, ff=FFS[ff]))
  cfg.update(overrides)
  return cfg


def build(cfg):
  lm = TransformerLM(cfg, rngs=nnx.Rngs(0))
  lm.eval()
  return lm


@pytest.mark.parametrize("attention", ["xl", "causal", "sparse_qkv"])
@pytest.mark.parametrize("ff", sorted(FFS))
def test_decode_steps_equal_the_full_forward(attention, ff):
  lm = build(lm_config(attention, ff))
  tokens = jax.random.randint(jax.random.key(1), (2, 7), 0, 32)
  full, _, _ = lm(tokens)
  np.testing.assert_allclose(decode_all(lm, tokens), full, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("overrides", [
    dict(loss_sparsity=4), dict(positions="sinusoidal"),
    dict(adapters={"kind": "houlsby", "bottleneck": 4}),
    dict(adapters={"kind": "pfeiffer", "bottleneck": 4})])
def test_decode_with_sparse_loss_sinusoidal_positions_and_adapters(overrides):
  lm = build(lm_config("causal", "dense", **overrides))
  tokens = jax.random.randint(jax.random.key(2), (1, 6), 0, 32)
  np.testing.assert_allclose(decode_all(lm, tokens), lm(tokens)[0], rtol=1e-5, atol=1e-5)


def test_greedy_generation_is_the_argmax_of_the_full_forward():
  lm = build(lm_config("sparse_qkv", "sparse_ff"))
  prompt = jax.random.randint(jax.random.key(3), (2, 3), 0, 32)
  out = sparse_jax.generate(lm, prompt, 4, temperature=0.0)
  assert out.shape == (2, 7)
  np.testing.assert_array_equal(out[:, :3], prompt)
  for i in range(3, 7):
    np.testing.assert_array_equal(out[:, i], jnp.argmax(lm(out[:, :i])[0][:, -1], axis=-1))


def test_sampling_depends_on_the_key_and_is_reproducible():
  lm = build(lm_config("causal", "dense"))
  prompt = jnp.zeros((1, 2), jnp.int32)
  a = sparse_jax.generate(lm, prompt, 12, temperature=1.0, rng=jax.random.key(0))
  b = sparse_jax.generate(lm, prompt, 12, temperature=1.0, rng=jax.random.key(0))
  c = sparse_jax.generate(lm, prompt, 12, temperature=1.0, rng=jax.random.key(1))
  np.testing.assert_array_equal(a, b)
  assert not np.array_equal(a, c)
