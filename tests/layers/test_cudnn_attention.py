"""The fused causal attention core (`layers.cudnn_attention`, `model.attention_core="cudnn"`)
against the XLA path (`causal_attention.attend`), float32 values and gradients.

cuDNN's kernels run only on a GPU, so on the CPU the call runs as JAX's XLA version of
`jax.nn.dot_product_attention` (`implementation="xla"`, patched in for the layers and the
LM): this checks what the repo adds (the layout, scale and causal mask handed to the call,
rotary positions composing, the config reaching the layers), not cuDNN's numerics. The
compiled program for an H100 (the cuDNN custom calls, no scores in memory):
tests/aot/test_cudnn_attention_compile.py.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from sparse_jax.configs import default
from sparse_jax.layers import cudnn_attention
from sparse_jax.layers.causal_attention import CausalSelfAttention, attend, causal_mask
from sparse_jax.layers.switchhead_attention import SwitchHeadAttention
from sparse_jax.models.lm import TransformerLM
from sparse_jax.models.lm_config import validate_model_config

_XLA_STAND_IN = functools.partial(cudnn_attention.attend_cudnn, implementation="xla")


def _qkv(b, t, h, d, seed=0):
  keys = jax.random.split(jax.random.key(seed), 3)
  return tuple(jax.random.normal(key, (b, t, h, d)) for key in keys)


def _value_and_grads(attention, qkv):
  """Output and the gradients of sum(sin(out) * w) in q, k and v."""
  weights = jax.random.normal(jax.random.key(7), qkv[0].shape)
  loss = lambda *a: jnp.sum(jnp.sin(attention(*a)) * weights)
  return attention(*qkv), jax.grad(loss, argnums=(0, 1, 2))(*qkv)


def _xla_path(q, k, v):
  return attend(q, k, v, causal_mask(q.shape[1]), nnx.Dropout(0.0, rngs=nnx.Rngs(0)))


# Head dims that are not a multiple of 8 (41, the MoEUT paper's 44M dense heads; 82, its
# SwitchHead heads; 5) are padded with zero channels inside the call.
@pytest.mark.parametrize("b, t, h, d", [(2, 5, 2, 8), (1, 37, 3, 16), (2, 64, 1, 128),
                                        (1, 19, 2, 41), (1, 9, 1, 82), (2, 6, 2, 5)])
def test_the_fused_call_equals_the_xla_path(b, t, h, d):
  qkv = _qkv(b, t, h, d)
  out, grads = _value_and_grads(_XLA_STAND_IN, qkv)
  ref_out, ref_grads = _value_and_grads(_xla_path, qkv)
  np.testing.assert_allclose(out, ref_out, atol=2e-5, rtol=1e-5)
  for name, got, want in zip("qkv", grads, ref_grads):
    np.testing.assert_allclose(got, want, atol=1e-4, rtol=1e-4, err_msg=name)


def _causal(core):
  return CausalSelfAttention(32, 2, 16, n_layers=2, rotary_fraction=0.5, use_bias=True,
                             core=core, rngs=nnx.Rngs(0))


def _switchhead(core):
  return SwitchHeadAttention(32, 2, 16, 4, 2, n_layers=2, impl="gather", core=core,
                             rngs=nnx.Rngs(0))


@pytest.mark.parametrize("make", [_causal, _switchhead], ids=["causal", "switchhead"])
def test_the_layers_on_the_fused_core_equal_the_xla_core(make, monkeypatch):
  """Rotary q and k (a rotated fraction) go into the fused call: outputs and the gradients of
  every parameter agree."""
  monkeypatch.setattr(cudnn_attention, "attend_cudnn", _XLA_STAND_IN)
  x_btd = jax.random.normal(jax.random.key(1), (2, 11, 32))
  results = {}
  for core in ("xla", "cudnn"):
    layer = make(core)
    loss = lambda layer: jnp.sum(jnp.sin(layer(x_btd)))
    results[core] = layer(x_btd), nnx.grad(loss)(layer)
  np.testing.assert_allclose(results["cudnn"][0], results["xla"][0], atol=2e-5, rtol=1e-5)
  got, want = jax.tree.leaves(results["cudnn"][1]), jax.tree.leaves(results["xla"][1])
  assert len(got) == len(want)
  for g, w in zip(got, want):
    np.testing.assert_allclose(g, w, atol=1e-4, rtol=1e-4)


def _lm_config(**overrides):
  cfg = default.get_config().model
  cfg.update(d_model=32, n_layers=2, n_heads=2, head_dim=16, dropout=0.0, vocab_size=64,
             attention="causal", mem_len=0, dtype="bfloat16", attention_core="cudnn")
  cfg.ff.update(n_experts=4, expert_size=8, k=2, expert_dropout=0.0)
  cfg.update(**overrides)
  return cfg


@pytest.mark.parametrize("attention, extra", [
    ("causal", {}), ("switchhead", {"attention_experts": 4, "attention_k": 2})])
def test_the_lm_runs_each_layer_on_the_core_it_is_given(attention, extra, monkeypatch):
  """`model.attention_core` reaches every layer: "cudnn" calls the fused core once per layer
  (logits as the XLA core's, within bfloat16 rounding), "auto" never."""
  calls = []

  def spy(q, k, v):
    calls.append(q.dtype)
    return _XLA_STAND_IN(q, k, v)

  monkeypatch.setattr(cudnn_attention, "attend_cudnn", spy)
  tokens_bt = jnp.asarray(np.random.default_rng(0).integers(0, 64, (2, 9)), jnp.int32)
  logits = {core: TransformerLM(_lm_config(attention=attention, attention_core=core, **extra),
                                rngs=nnx.Rngs(0))(tokens_bt)[0]
            for core in ("auto", "cudnn")}
  assert calls == [jnp.bfloat16] * 2
  np.testing.assert_allclose(np.asarray(logits["cudnn"], np.float32),
                             np.asarray(logits["auto"], np.float32), atol=0.05, rtol=0.05)


def test_the_fused_call_refuses_float32():
  with pytest.raises(ValueError, match="model.dtype='bfloat16'"):
    cudnn_attention.attend_cudnn(*_qkv(1, 4, 1, 8))


@pytest.mark.parametrize("core, head_dim, attn_dropout, match", [
    ("flash", 16, 0.0, "attention_core must be one of"),
    ("cudnn", 130, 0.0, "at most 128"),
    ("cudnn", 136, 0.0, "at most 128"),
    ("cudnn", 16, 0.1, "attn_dropout=0"),
])
def test_the_layers_refuse_what_cudnn_does_not_run(core, head_dim, attn_dropout, match):
  with pytest.raises(ValueError, match=match):
    CausalSelfAttention(32, 2, head_dim, n_layers=1, attn_dropout=attn_dropout, core=core,
                        rngs=nnx.Rngs(0))
  with pytest.raises(ValueError, match=match):
    SwitchHeadAttention(32, 2, head_dim, 4, 2, n_layers=1, attn_dropout=attn_dropout,
                        core=core, rngs=nnx.Rngs(0))
  CausalSelfAttention(32, 2, head_dim, n_layers=1, attn_dropout=attn_dropout, core="xla",
                      rngs=nnx.Rngs(0))


@pytest.mark.parametrize("overrides, field", [
    ({"attention_core": "flash"}, "model.attention_core"),
    ({"dtype": "float32"}, "model.dtype"),
    ({"head_dim": 130}, "model.head_dim"),
    ({"head_dim": 136}, "model.head_dim"),
    ({"attn_dropout": 0.1}, "model.attn_dropout"),
    ({"attention": "xl", "mem_len": 4}, "model.attention_core"),
    ({"attention": "xl", "mem_len": 4, "attention_core": "xla"}, "model.attention_core"),
    ({"attention": "sparse_qkv", "head_dim": None}, "model.attention_core"),
])
def test_bad_attention_core_configs_name_the_field(overrides, field):
  with pytest.raises(ValueError, match=field.replace(".", r"\.")):
    validate_model_config(_lm_config(**overrides))


def test_attention_core_configs_validate():
  for core in cudnn_attention.CORES:
    validate_model_config(_lm_config(attention_core=core))
    validate_model_config(_lm_config(attention_core=core, head_dim=41))  # padded to 48
  for core in ("auto", "xla"):
    validate_model_config(_lm_config(attention_core=core, dtype="float32", head_dim=12,
                                     attn_dropout=0.1))
  validate_model_config(_lm_config(attention="switchhead", attention_experts=4,
                                   attention_k=2, head_dim=128))
  validate_model_config(_lm_config(attention="xl", mem_len=4, attention_core="auto"))
