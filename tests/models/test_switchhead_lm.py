"""SwitchHead attention as the LM's `model.attention="switchhead"`: config checks, decoding
equal to the teacher-forced forward on every CPU impl, and routing health per head (against a
brute-force count of the chosen experts). Training and resuming:
tests/training/test_attention_kinds_resume.py."""

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from lm_testing import decode_all

from sparse_jax.configs import default
from sparse_jax.models.lm import TransformerLM
from sparse_jax.models.lm_config import validate_model_config
from sparse_jax.training import routing_health

H, E, K = 2, 4, 2


def _model_config(**overrides):
  cfg = default.get_config().model
  cfg.update(d_model=32, n_layers=2, n_heads=H, attention="switchhead", attention_experts=E,
             attention_k=K, dropout=0.0)
  cfg.ff.update(n_experts=4, expert_size=8, k=2, expert_dropout=0.0)
  cfg.update(**overrides)
  return cfg


@pytest.mark.parametrize("overrides, field", [
    ({"attention_experts": 1}, "model.attention_experts"),
    ({"attention_experts": None}, "model.attention_experts"),
    ({"attention_k": 5}, "model.attention_k"),
    ({"attention_k": None}, "model.attention_k"),
    ({"attention": "causal"}, "model.attention_experts"),
    ({"attention": "causal", "attention_experts": None, "attention_k": None,
      "attention_impl": "gather"}, "model.attention_impl"),
    ({"head_dim": 3}, "model.head_dim"),  # half of 3, rounded down to even, rotates none
])
def test_bad_switchhead_configs_name_the_field(overrides, field):
  with pytest.raises(ValueError, match=field.replace(".", r"\.")):
    validate_model_config(_model_config(**overrides))


def test_sinusoidal_positions_lift_the_head_dim_rule():
  validate_model_config(_model_config(head_dim=3, positions="sinusoidal"))


@pytest.mark.parametrize("positions, impl", [("rotary", "blocked"), ("rotary", "pallas"),
                                             ("sinusoidal", "gather")])
def test_decoding_equals_the_teacher_forced_forward(positions, impl):
  """Token-by-token decoding from the KV cache gives the logits of one forward pass over the
  sequence (float32; the same products summed in another order, so ~1e-6)."""
  lm = TransformerLM(_model_config(attention_impl=impl, positions=positions),
                     rngs=nnx.Rngs(0))
  tokens_bt = jnp.asarray(np.random.default_rng(0).integers(0, 256, (2, 9)), jnp.int32)
  logits_btv, _, _ = lm(tokens_bt)
  np.testing.assert_allclose(decode_all(lm, tokens_bt), logits_btv, atol=2e-5, rtol=2e-5)


def test_every_impl_gives_the_gather_oracles_logits():
  tokens_bt = jnp.asarray(np.random.default_rng(1).integers(0, 256, (2, 7)), jnp.int32)
  logits = {impl: TransformerLM(_model_config(attention_impl=impl), rngs=nnx.Rngs(3))(tokens_bt)[0]
            for impl in ("gather", "blocked", "pallas")}
  for impl in ("blocked", "pallas"):
    np.testing.assert_allclose(logits[impl], logits["gather"], atol=2e-5, rtol=2e-5)


def test_routing_shares_per_head_count_the_chosen_experts():
  """`layer{i}/attn_v/token_share [H, E]` is each head's count of tokens per expert over the
  tokens (rows sum to K), recounted here from the layer's own selections."""
  lm = TransformerLM(_model_config(), rngs=nnx.Rngs(0))
  tokens_bt = jnp.asarray(np.random.default_rng(2).integers(0, 256, (3, 8)), jnp.int32)
  _, _, aux = lm(tokens_bt)
  h_btd = lm.blocks[0].attn_norm(lm._embed(tokens_bt, 0))
  _, layer_aux = lm.blocks[0].attn.apply_with_aux(h_btd)
  for router in ("v", "o"):
    sel_nhk = np.asarray(layer_aux[f"{router}_selection"]).reshape(-1, H, K)
    counts_he = np.stack([np.bincount(sel_nhk[:, h].ravel(), minlength=E) for h in range(H)])
    share_he = np.asarray(aux[f"layer0/attn_{router}/token_share"])
    np.testing.assert_allclose(share_he, counts_he / sel_nhk.shape[0], rtol=1e-6)
    np.testing.assert_allclose(share_he.sum(-1), K, rtol=1e-6)
  metrics = routing_health.step_metrics(aux)
  assert {"routing/layer1/attn_v/token_share", "routing/layer1/attn_o/token_share"} <= set(metrics)


def test_routing_health_reports_the_worst_head():
  share_he = np.array([[0.5, 0.5, 0.5, 0.5], [2.0, 0.0, 0.0, 0.0]])  # head 1 collapsed, K = 2
  stats = routing_health.layer_stats(share_he)
  assert stats == {"usage_entropy": 0.0, "dead_fraction": 0.75, "top_share": 2.0}
  uniform = 0.5  # K / E
  assert routing_health.top_share_limit(share_he) == max(
      routing_health.TOP_SHARE_LIMIT, routing_health.TOP_SHARE_OVER_UNIFORM * uniform)
  health = routing_health.RoutingHealth(warn=False)
  logged = health(10, {"routing/layer3/attn_o/token_share": share_he})
  assert logged["routing/layer3/attn_o/dead_fraction"] == 0.75
  assert ("layer3/attn_o", "dead_fraction") in health.warned


def test_xl_decoding_through_memory_equals_the_full_forward(impl="blocked"):
  """`switchhead_xl`: the memory carries the context, so decoding one token at a time (each
  step attending to the previous ones through the memory, at their relative positions)
  gives the logits of one forward pass over the whole sequence."""
  lm = TransformerLM(_model_config(attention="switchhead_xl", attention_impl=impl, mem_len=4),
                     rngs=nnx.Rngs(0))
  tokens_bt = jnp.asarray(np.random.default_rng(4).integers(0, 256, (2, 9)), jnp.int32)
  logits_btv, _, aux = lm(tokens_bt)
  assert aux["layer1/attn_v/token_share"].shape == (H, E)
  np.testing.assert_allclose(decode_all(lm, tokens_bt), logits_btv, atol=2e-5, rtol=2e-5)


def test_xl_segments_with_memory_equal_one_long_segment():
  """Two segments of 5, the second reading the first through a memory of 5, give the logits
  of one segment of 10 (same keys at the same relative offsets)."""
  lm = TransformerLM(_model_config(attention="switchhead_xl", mem_len=5), rngs=nnx.Rngs(1))
  tokens_bt = jnp.asarray(np.random.default_rng(5).integers(0, 256, (2, 10)), jnp.int32)
  whole_btv, _, _ = lm(tokens_bt, lm.init_memory(2, 10))
  first_btv, memory, _ = lm(tokens_bt[:, :5])
  second_btv, _, _ = lm(tokens_bt[:, 5:], memory)
  np.testing.assert_allclose(np.concatenate([first_btv, second_btv], axis=1), whole_btv,
                             atol=2e-5, rtol=2e-5)
