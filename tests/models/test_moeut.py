"""MoEUT as `TransformerLM` options: shared layer groups, the peri-LayerNorm, the per-sequence
entropy regulariser over time and repeats (against float64 numpy), the MoE router reading its
own input, decoding, and sparse_jax/configs/moeut_paper.py's parameter counts against the authors'."""

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from flax import nnx
from lm_testing import decode_all

import pallas_kernels
from sparse_jax.configs import default, moeut_paper
from sparse_jax.layers.moe import SigmaMoE
from sparse_jax.models.accounting import model_report
from sparse_jax.models.lm import TransformerLM
from sparse_jax.models.lm_config import EMBED_INITS, validate_model_config
from sparse_jax.models.moeut_regularizer import negative_sequence_entropy

H, E, K = 2, 4, 2


def _config(**overrides):
  cfg = default.get_config().model
  cfg.update(d_model=32, n_layers=4, n_heads=H, mem_len=0, attention="switchhead",
             attention_experts=E, attention_k=K, layer_groups=2, block_norm="peri",
             moeut_ff_reg=0.01, moeut_attention_reg=0.001, dropout=0.0)
  cfg.ff.update(n_experts=6, expert_size=8, k=2, expert_dropout=0.0, reg_coef=0.0)
  if "ff" in overrides:
    cfg.ff = ml_collections.ConfigDict(overrides.pop("ff"))
  cfg.update(**overrides)
  return cfg


def _tokens(seed=0, t=7):
  return jnp.asarray(np.random.default_rng(seed).integers(0, 256, (2, t)), jnp.int32)


def np_negative_entropy(logits_per_repeat):
  """Loops: per sequence (and head), the mean over time and repeats of softmax(logits), then
  sum p log p; averaged over sequences and heads (float64)."""
  logits = np.concatenate([np.asarray(x, np.float64) for x in logits_per_repeat], axis=1)
  b, n = logits.shape[:2]
  rest = logits.shape[2:-1]
  values = []
  for i in range(b):
    for idx in np.ndindex(*rest):
      rows = logits[(i, slice(None), *idx)]
      p = np.exp(rows - rows.max(-1, keepdims=True))
      p_bar = (p / p.sum(-1, keepdims=True)).mean(0)
      values.append(np.sum(p_bar * np.log(p_bar)))
  return np.mean(values)


@pytest.mark.parametrize("shape", [(3, 5, 6), (2, 4, 3, 5)])
def test_negative_sequence_entropy_matches_numpy(shape):
  keys = jax.random.split(jax.random.key(0), 3)
  repeats = [2.0 * jax.random.normal(k, shape) for k in keys]
  got = negative_sequence_entropy(repeats)
  np.testing.assert_allclose(got, np_negative_entropy(repeats), rtol=1e-5)
  grad = jax.grad(lambda x: negative_sequence_entropy([x, *repeats[1:]]))(repeats[0])
  u, eps = np.random.default_rng(1).standard_normal(shape), 1e-4
  x0 = np.asarray(repeats[0], np.float64)
  fd = (np_negative_entropy([x0 + eps * u, *repeats[1:]])
        - np_negative_entropy([x0 - eps * u, *repeats[1:]])) / (2 * eps)
  np.testing.assert_allclose(np.sum(np.asarray(grad) * u), fd, rtol=1e-3, atol=1e-6)


def test_reg_loss_is_the_regularizer_of_the_logged_logits():
  """Layers 0, 2 share block 0 and 1, 3 block 1: gamma and delta times the numpy value of
  each group's FF and attention logits over its two repeats."""
  lm = TransformerLM(_config(), rngs=nnx.Rngs(0))
  _, _, aux = lm(_tokens())
  want = 0.0
  for group in (0, 1):
    layers = (group, group + 2)
    want += 0.01 * np_negative_entropy([aux[f"layer{i}/router_logits"] for i in layers])
    for router in ("v", "o"):
      want += 0.001 * np_negative_entropy([aux[f"layer{i}/attn_{router}/logits"] for i in layers])
  np.testing.assert_allclose(aux["reg_loss"], want, rtol=1e-5)


def test_shared_groups_equal_distinct_layers_with_copied_weights():
  """G = 2 of 4 layers computes what 4 distinct layers compute when layers 2 and 3 hold
  copies of layers 0 and 1 (ABAB)."""
  shared = TransformerLM(_config(), rngs=nnx.Rngs(0))
  distinct = TransformerLM(_config(layer_groups=None), rngs=nnx.Rngs(1))
  assert len(shared.blocks) == 2 and len(distinct.blocks) == 4
  nnx.update(distinct.embed, nnx.state(shared.embed))
  nnx.update(distinct.final_norm, nnx.state(shared.final_norm))
  distinct.w_out.value, distinct.b_out.value = shared.w_out.value, shared.b_out.value
  for i in range(4):
    nnx.update(distinct.blocks[i], nnx.state(shared.blocks[i % 2]))
  tokens = _tokens(1)
  np.testing.assert_allclose(distinct(tokens)[0], shared(tokens)[0], rtol=1e-5, atol=1e-5)


def test_peri_norm_routes_on_the_norm_and_computes_on_the_residual():
  """One peri block, composed by hand from its parts: SwitchHead's q, k and routers read
  LN(h) and its values h; the FF routes on LN(h) and its experts read h."""
  lm = TransformerLM(_config(), rngs=nnx.Rngs(2))
  block = lm.blocks[0]
  h = jax.random.normal(jax.random.key(3), (2, 5, 32))
  attended, _ = block.attn.apply_with_aux(block.attn_norm(h), h)
  h1 = h + attended
  y, _ = block.ff(h1, sel_input=block.ff_norm(h1))
  got, _ = block(h, None, None)
  np.testing.assert_allclose(got, h1 + y, rtol=1e-6, atol=1e-6)
  pre = TransformerLM(_config(block_norm="pre", moeut_attention_reg=0.0, moeut_ff_reg=0.0),
                      rngs=nnx.Rngs(2))
  assert not np.allclose(pre.blocks[0](h, None, None)[0], got, atol=1e-3)


def test_moe_router_reads_its_own_input():
  moe = SigmaMoE(16, 6, 8, 2, n_layers=2, impl="gather", rngs=nnx.Rngs(0))
  x, s = (jax.random.normal(jax.random.key(i), (10, 16)) for i in (1, 2))
  y, aux = moe(x, sel_input=s)
  r = moe.router(s)
  want = pallas_kernels.expert_mlp(x, r.sel_nk, r.gates_nk, moe.w_up[...], moe.w_down[...],
                                   impl="gather")
  np.testing.assert_allclose(y, want, rtol=1e-6, atol=1e-6)
  np.testing.assert_allclose(aux["router_logits"], r.logits_ne, rtol=1e-6)
  assert not np.allclose(moe(x)[0], y, atol=1e-4)


def test_decoding_equals_the_teacher_forced_forward():
  """Each of the 4 layers keeps its own KV cache, also where two share weights."""
  lm = TransformerLM(_config(), rngs=nnx.Rngs(4))
  tokens = _tokens(2, t=6)
  logits, _, _ = lm(tokens)
  assert len(lm.init_cache(2, 8)["layers"]) == 4
  np.testing.assert_allclose(decode_all(lm, tokens), logits, rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("overrides, field", [
    ({"layer_groups": 3}, "model.layer_groups"),
    ({"attention": "causal", "attention_experts": None, "attention_k": None,
      "moeut_attention_reg": 0.0}, "model.block_norm"),
    ({"ff": {"kind": "dense", "d_ff": 64}, "block_norm": "pre"}, "model.moeut_ff_reg"),
    ({"attention": "causal", "attention_experts": None, "attention_k": None,
      "block_norm": "pre"}, "model.moeut_attention_reg"),
    ({"attention": "sparse_qkv", "attention_experts": None, "attention_k": None,
      "block_norm": "pre", "moeut_attention_reg": 0.0, "rotary_fraction": 0.5},
     "model.rotary_fraction"),
])
def test_bad_moeut_configs_name_the_field(overrides, field):
  with pytest.raises(ValueError, match=field.replace(".", r"\.")):
    validate_model_config(_config(**overrides))


# The authors' parameter counts (all weights, embeddings included; computed from their code's
# shapes and matching the paper's 44M / 244M labels).
AUTHORS = {("44m", "moeut"): 44.35e6, ("44m", "dense"): 44.5e6, ("244m", "moeut"): 243.3e6,
           ("244m", "dense"): 243.6e6}


@pytest.mark.parametrize("size", ["44m", "244m"])
def test_paper_configs_have_the_authors_parameter_counts(size):
  counts = {v: model_report(moeut_paper.get_config(f"{size},{v}").model)["total_params"]
            for v in moeut_paper.VARIANTS}
  for variant in ("moeut", "dense"):
    assert abs(counts[variant] / AUTHORS[size, variant] - 1) < 0.01, (variant, counts)
  assert abs(counts["sigma_moe"] / counts["moeut"] - 1) < 0.01, counts


def test_paper_configs_take_the_authors_embedding_init_and_epsilon():
  """Their `kaiming_normal_` (fan-in d_model: std 1/sqrt(d)) and torch's LayerNorm epsilon."""
  model = validate_model_config(moeut_paper.get_config("44m,moeut").model)
  assert model.layer_norm_eps == 1e-5
  table = EMBED_INITS[model.embed_init](jax.random.key(0), (8000, 412))
  assert float(jnp.std(table)) == pytest.approx(1 / np.sqrt(412), rel=0.02)
