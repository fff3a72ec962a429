"""TransformerLM: causality, XL memory semantics, config validation."""

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from flax import nnx

from sparse_jax.models import TransformerLM
from sparse_jax.validation import ConfigError


def model_config(**overrides) -> ml_collections.ConfigDict:
  cfg = ml_collections.ConfigDict(dict(
      vocab_size=50, d_model=24, n_layers=2, n_heads=3, mem_len=8, dropout=0.0,
      ff=dict(kind="dense", d_ff=40)))
  cfg.update(overrides)
  return cfg


@pytest.fixture(scope="module")
def lm():
  model = TransformerLM(model_config(), rngs=nnx.Rngs(0))
  model.eval()
  return model


def tokens(seed, shape=(2, 8)):
  return jax.random.randint(jax.random.key(seed), shape, 0, 50)


def test_future_tokens_never_change_past_logits(lm):
  first, second = tokens(1), tokens(2)
  _, memory, _ = lm(first)
  t = 3
  changed = second.at[:, t + 1:].set((second[:, t + 1:] + 7) % 50)
  for mem in (None, memory):
    logits, _, _ = lm(second, mem)
    logits_changed, _, _ = lm(changed, mem)
    np.testing.assert_allclose(logits[:, :t + 1], logits_changed[:, :t + 1], atol=1e-6)
    assert np.abs(logits[:, t + 1:] - logits_changed[:, t + 1:]).max() > 1e-3


def test_memory_is_used(lm):
  _, memory, _ = lm(tokens(1))
  with_memory, _, _ = lm(tokens(2), memory)
  without, _, _ = lm(tokens(2))
  assert np.abs(with_memory - without).max() > 1e-3


def test_segments_with_memory_equal_one_long_sequence(lm):
  """With mem_len >= the segment length, two segments are the full sequence split in two."""
  full = tokens(3, (2, 16))
  logits_full, _, _ = lm(full)
  logits_a, memory, _ = lm(full[:, :8])
  logits_b, _, _ = lm(full[:, 8:], memory)
  np.testing.assert_allclose(jnp.concatenate([logits_a, logits_b], 1), logits_full,
                             rtol=1e-4, atol=1e-4)


def test_memory_holds_stop_gradient_layer_inputs(lm):
  def memory_sum(model):
    _, memory, _ = model(tokens(4))
    return memory.hidden_lbmd.sum()

  grads = nnx.grad(memory_sum)(lm)
  assert all(np.all(g == 0) for g in jax.tree.leaves(grads))
  _, memory, _ = lm(tokens(4))
  expected_first_layer_input = lm.embed(tokens(4))
  np.testing.assert_allclose(memory.hidden_lbmd[0, :, -8:], expected_first_layer_input,
                             rtol=1e-6)
  assert int(memory.valid) == 8


def test_dense_reg_loss_is_zero_and_shapes(lm):
  logits, memory, aux = lm(tokens(5))
  assert logits.shape == (2, 8, 50) and logits.dtype == jnp.float32
  assert memory.hidden_lbmd.shape == (2, 2, 8, 24)
  assert float(aux["reg_loss"]) == 0.0


def test_tied_embeddings_share_the_table():
  lm = TransformerLM(model_config(tie_embeddings=True), rngs=nnx.Rngs(0))
  assert not hasattr(lm, "w_out")
  grads = nnx.grad(lambda m: m(tokens(6))[0][:, -1, 3].sum())(lm)
  # Only the output path reaches embedding row 3 through the tied projection.
  assert np.abs(np.asarray(grads["embed"]["embedding"][3])).max() > 0


def test_head_dim_may_differ_from_d_model_over_heads():
  """The paper's WT-S uses d_model 412 with 10 heads of 41."""
  lm = TransformerLM(model_config(d_model=26, n_heads=3, head_dim=5), rngs=nnx.Rngs(0))
  assert lm(tokens(7))[0].shape == (2, 8, 50)


@pytest.mark.parametrize("overrides,field", [
    (dict(d_model=25), "model.d_model"),
    (dict(ff=dict(kind="nope", d_ff=4)), "model.ff.kind"),
    (dict(ff=dict(kind="dense", d_ff=0)), "model.ff.d_ff"),
    (dict(n_layers=0), "model.n_layers"),
    (dict(dropout=1.5), "model.dropout"),
    (dict(mem_len=-1), "model.mem_len"),
    (dict(dtype="float16"), "model.dtype"),
])
def test_bad_configs_name_the_field(overrides, field):
  with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
    TransformerLM(model_config(**overrides), rngs=nnx.Rngs(0))
