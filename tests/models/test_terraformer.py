"""Terraformer: concatenation with padding, greedy decoding, reversibility, config errors."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import terraformer_testing
from sparse_jax.configs import terraformer_arithmetic
from sparse_jax.models.rngs import make_rngs
from sparse_jax.models.terraformer import Terraformer, concat_with_padding, strip_decoder
from sparse_jax.models.terraformer_config import TerraformerConfig
from sparse_jax.validation import ConfigError


def tiny_config(**overrides):
  """A 2+2-layer d_model 32 Terraformer (LSH chunks of 4, sparse FF, SRU)."""
  cfg = terraformer_arithmetic.model_config(transformer=False)
  cfg.update({"d_model": 32, "n_heads": 2, **overrides})
  cfg.ff.d_ff = 64
  cfg.lsh.update(chunk_len=4, n_buckets=4)
  return cfg


def padded_inputs(seed: int = 0) -> tuple[jax.Array, jax.Array]:
  """Inputs `[3, 9]` with 9, 6 and 3 real tokens (PAD 0 after them); targets `[3, 7]`."""
  rng = np.random.default_rng(seed)
  inputs = rng.integers(2, 12, size=(3, 9))
  inputs[1, 6:] = 0
  inputs[2, 3:] = 0
  return jnp.asarray(inputs), jnp.asarray(rng.integers(2, 12, size=(3, 7)))


def test_concat_and_strip_match_a_row_by_row_reference():
  rng = np.random.default_rng(1)
  enc = rng.normal(size=(3, 5, 2)).astype(np.float32)
  dec = rng.normal(size=(3, 4, 2)).astype(np.float32)
  n_valid = np.array([5, 2, 0])
  got = np.asarray(concat_with_padding(jnp.asarray(enc), jnp.asarray(n_valid), jnp.asarray(dec)))
  for b, n in enumerate(n_valid):
    want = np.concatenate([enc[b, :n], dec[b], np.zeros((5 - n, 2), np.float32)])
    np.testing.assert_array_equal(got[b], want)
  np.testing.assert_array_equal(strip_decoder(jnp.asarray(got), jnp.asarray(n_valid), 4), dec)


def randomize_positions(model: Terraformer, scale: float = 0.3) -> None:
  """Fixed-base position weights start at U(+-1e-4), too small to matter; random ones do."""
  params = [param for positions in (model.encoder_positions, model.decoder_positions)
            if positions is not None
            for _, param in nnx.iter_graph(positions) if isinstance(param, nnx.Param)]
  for i, param in enumerate(params):
    param[...] = scale * jax.random.normal(jax.random.key(i), param[...].shape)


@pytest.mark.parametrize("qkv,positions,reversible_encoder", [
    ("dense", "fixed_base", False), ("sparse", "fixed_base", False),
    ("dense", "sinusoid", False), ("dense", "fixed_base", True)])
def test_greedy_decoding_agrees_with_the_teacher_forced_forward(qkv, positions,
                                                                reversible_encoder):
  """Dense attention: decoding the concatenation one position at a time through the caches
  computes the forward's function, so the forward fed the greedy answers predicts them."""
  model = Terraformer(tiny_config(encoder_attention="dense", decoder_attention="dense",
                                  decoder_qkv=qkv, positions=positions,
                                  reversible_encoder=reversible_encoder), rngs=make_rngs(0))
  randomize_positions(model)
  model.eval()
  inputs, _ = padded_inputs()
  answers = model.greedy_decode(inputs, 7)
  logits, _ = model(inputs, answers)
  np.testing.assert_array_equal(jnp.argmax(logits, -1), answers)
  assert len(np.unique(np.asarray(answers))) > 1  # Not a constant answer.


def test_encoder_padding_does_not_change_the_prediction():
  """More PAD columns after the inputs leave the logits unchanged (dense attention: the
  encoder masks padded keys, the concatenation drops them)."""
  model = Terraformer(tiny_config(encoder_attention="dense", decoder_attention="dense"),
                      rngs=make_rngs(0))
  model.eval()
  inputs, targets = padded_inputs()
  wider = jnp.pad(inputs, ((0, 0), (0, 5)))
  np.testing.assert_allclose(model(wider, targets)[0], model(inputs, targets)[0], atol=2e-5)


@pytest.mark.parametrize("field,value,message", [
    ("ff", {"kind": "switch", "n_experts": 4, "expert_size": 8, "k": 1}, "model.ff.kind"),
    ("attention_sparsity", 2, "model.attention_sparsity"),
    ("loss_sparsity", 3, "model.loss_sparsity"),
    ("n_heads", 3, "model.d_model"),
])
def test_bad_configs_name_the_field(field, value, message):
  cfg = tiny_config()
  cfg[field] = value
  with pytest.raises(ConfigError, match=message):
    TerraformerConfig.parse(cfg, "model")


def test_lsh_buckets_must_be_even():
  cfg = tiny_config()
  cfg.lsh.n_buckets = 5
  with pytest.raises(ConfigError, match="model.lsh.n_buckets"):
    TerraformerConfig.parse(cfg, "model")


def loss_and_grads(reversible: bool, **overrides):
  """Loss and parameter gradients in training mode (dropout, Gumbel noise, fresh LSH hashes,
  random position offsets) with the same weights and the same RNG keys."""
  model = Terraformer(tiny_config(reversible=reversible, dropout=0.1, attn_dropout=0.1,
                                  **overrides), rngs=make_rngs(0))
  return terraformer_testing.loss_and_grads(model, *padded_inputs())


@pytest.mark.parametrize("reversible_encoder", [False, True])
def test_reversible_gradients_equal_the_stored_activation_ones(reversible_encoder):
  """Recomputing the blocks backwards (replaying buckets, sparse FF choices and RNG keys)
  gives the gradients of plain autodiff; float32 reconstruction error stays ~1e-6."""
  loss_rev, grads_rev = loss_and_grads(True, reversible_encoder=reversible_encoder)
  loss_seq, grads_seq = loss_and_grads(False, reversible_encoder=reversible_encoder)
  np.testing.assert_allclose(loss_rev, loss_seq, rtol=1e-6)
  flat_rev = jax.tree_util.tree_leaves_with_path(grads_rev)
  flat_seq = jax.tree.leaves(grads_seq)
  assert len(flat_rev) == len(flat_seq) > 50
  for (path, got), want in zip(flat_rev, flat_seq):
    scale = np.abs(want).max() + 1e-6
    np.testing.assert_allclose(got / scale, want / scale, atol=2e-4, err_msg=str(path))


def test_reversible_encoder_joins_each_stream_without_the_dense_join():
  """Trax's `reversible_encoder=True`: no Dense + LayerNorm after the encoder, and the
  decoder's two streams start from the encoder's two different streams."""
  model = Terraformer(tiny_config(reversible_encoder=True), rngs=make_rngs(0))
  model.eval()
  assert model.encoder_out is None and model.encoder_norm is None
  (e1, e2), n_valid, _ = model.encode(padded_inputs()[0])
  assert e1.shape == e2.shape == (3, 9, 32) and not np.allclose(e1, e2)
  joined = Terraformer(tiny_config(), rngs=make_rngs(0))
  joined.eval()
  (j1, j2), _, _ = joined.encode(padded_inputs()[0])
  np.testing.assert_array_equal(j1, j2)


@pytest.mark.parametrize("init,std", [("uniform", 1 / np.sqrt(256)), ("normal", 1.0)])
def test_embedding_init_is_trax_uniform_or_unit_normal(init, std):
  """Trax's `Embedding`: U(+-sqrt(3 / d)), std 1/sqrt(d); the option: N(0, 1)."""
  model = Terraformer(tiny_config(d_model=256, n_heads=4, embedding_init=init),
                      rngs=make_rngs(0))
  table = np.asarray(model.embed.embedding[...], np.float64)
  assert table.std() == pytest.approx(std, rel=0.05)
  if init == "uniform":
    assert np.abs(table).max() <= np.sqrt(3 / 256)
