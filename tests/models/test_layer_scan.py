"""`model.scan_layers`: the layers under one scan compute what the unrolled loop does, values,
random draws and gradients, and the program no longer grows with depth."""

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from flax import nnx
from lm_testing import decode_all

from sparse_jax.models import TransformerLM
from sparse_jax.models.layer_scan import scan_layers
from sparse_jax.models.rngs import make_rngs, reseed

SIGMA_MOE = dict(kind="sigma_moe", n_experts=4, expert_size=8, k=2, reg_coef=0.01,
                 expert_dropout=0.1)
# Dropout everywhere (and expert dropout, noisy routing), so that a layer drawing another
# layer's masks would show.
MODELS = {
    "xl_sigma_moe": dict(attention="xl", mem_len=6, ff=SIGMA_MOE),
    "causal_noisy_topk": dict(attention="causal", mem_len=0,
                              ff=dict(kind="noisy_topk", n_experts=4, reg_coef=0.01,
                                      expert_size=8, k=2)),
    "switchhead_xl": dict(attention="switchhead_xl", mem_len=6, attention_experts=3,
                          attention_k=2, ff=dict(kind="dense", d_ff=32)),
    "moeut_shared": dict(attention="switchhead", mem_len=0, attention_experts=3, attention_k=2,
                         n_layers=4, layer_groups=2, block_norm="peri", moeut_ff_reg=0.01,
                         moeut_attention_reg=0.001, ff=SIGMA_MOE),
}


def lm_config(name: str, *, scan: bool, remat: str = "none"):
  fields = dict(vocab_size=40, d_model=16, n_layers=3, n_heads=2, dropout=0.2,
                attn_dropout=0.1, remat=remat, scan_layers=scan)
  fields.update(MODELS[name])
  return ml_collections.ConfigDict(fields)


def _loss(model, tokens_bt, memory):
  logits, new_memory, aux = model(tokens_bt, memory)
  return jnp.mean(logits ** 2) + aux["reg_loss"], (logits, new_memory, aux)


@nnx.jit
def _two_segments(model, tokens_sbt):
  """Loss, outputs and gradients of the second of two segments (the first's memory carried),
  and the model's random streams after both."""
  _, memory, _ = model(tokens_sbt[0])
  (_, outputs), grads = nnx.value_and_grad(_loss, has_aux=True)(model, tokens_sbt[1], memory)
  return outputs, grads, nnx.state(model, nnx.RngCount)


def _run(name: str, *, scan: bool, remat: str = "none"):
  model = TransformerLM(lm_config(name, scan=scan, remat=remat), rngs=make_rngs(0))
  model.train()
  reseed(model, 0, 5)
  tokens_sbt = jax.random.randint(jax.random.key(1), (2, 2, 7), 0, 40)
  return jax.tree.map(np.asarray, _as_state(*_two_segments(model, tokens_sbt)))


def _as_state(outputs, grads, counts):
  logits, memory, aux = outputs
  return {"logits": logits, "memory": memory.hidden_lbmd, "aux": aux,
          "grads": nnx.to_pure_dict(grads), "counts": nnx.to_pure_dict(counts)}


@pytest.mark.parametrize("name,remat", [("xl_sigma_moe", "none"), ("xl_sigma_moe", "block"),
                                        ("causal_noisy_topk", "none"),
                                        ("switchhead_xl", "dots"), ("moeut_shared", "none")])
def test_scan_equals_unrolled(name, remat):
  """Float32, dropout on: the same operations in another program, so equal to rounding (rtol
  1e-5, plus 1e-5 of the largest entry for sums that cancel near zero, as in test_remat);
  the streams' counts exactly (the same draws)."""
  expected = _run(name, scan=False, remat=remat)
  got = _run(name, scan=True, remat=remat)
  assert jax.tree.structure(got) == jax.tree.structure(expected)
  np.testing.assert_array_equal(jax.tree.leaves(got["counts"]),
                                jax.tree.leaves(expected["counts"]))
  for key in ("logits", "memory", "aux", "grads"):
    scale = max(float(np.abs(x).max(initial=0.0)) for x in jax.tree.leaves(expected[key]))
    jax.tree.map(lambda g, e: np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-5 * scale),
                 got[key], expected[key])


@pytest.mark.parametrize("name", ["xl_sigma_moe", "moeut_shared"])
def test_scanned_decoding_equals_unrolled(name):
  """Token-by-token decoding (the XL memory, or per-layer KV caches, which stay unrolled)."""
  tokens_bt = jax.random.randint(jax.random.key(2), (2, 5), 0, 40)
  logits = []
  for scan in (False, True):
    model = TransformerLM(lm_config(name, scan=scan), rngs=make_rngs(0))
    model.eval()
    logits.append(decode_all(model, tokens_bt))
  np.testing.assert_allclose(logits[1], logits[0], rtol=1e-5, atol=1e-5)


def test_dropout_masks_differ_between_layers_under_scan():
  """The equality above would hold trivially if dropout were off: with it on, changing one
  layer's dropout key changes the scanned model's output."""
  model = TransformerLM(lm_config("xl_sigma_moe", scan=True), rngs=make_rngs(0))
  model.train()
  tokens_bt = jax.random.randint(jax.random.key(1), (2, 7), 0, 40)
  reseed(model, 0, 5)
  before, _, _ = nnx.jit(lambda m, t: m(t))(model, tokens_bt)
  reseed(model, 0, 5)
  nnx.reseed(model.blocks[1].dropout, dropout=jax.random.key(123))
  after, _, _ = nnx.jit(lambda m, t: m(t))(model, tokens_bt)
  assert not np.allclose(before, after)


def _count_in_program(n_layers: int, scan: bool, op: str) -> int:
  config = lm_config("xl_sigma_moe", scan=scan)
  config.n_layers = n_layers
  model = TransformerLM(config, rngs=make_rngs(0))
  graphdef, state = nnx.split(model)
  tokens_bt = jnp.zeros((2, 7), jnp.int32)

  def grads(state):
    return nnx.grad(lambda m: _loss(m, tokens_bt, None)[0])(nnx.merge(graphdef, state))

  return jax.jit(grads).lower(state).as_text().count(op)


def test_scanned_program_does_not_grow_with_depth():
  """The lowered training gradient: unrolled, its matmuls grow with n_layers; scanned, the
  same program text for 2 and 6 layers."""
  assert _count_in_program(6, False, "dot_general") > _count_in_program(2, False, "dot_general")
  assert _count_in_program(6, True, "dot_general") == _count_in_program(2, True, "dot_general")
  assert _count_in_program(2, True, "stablehlo.while") >= 2  # forward and backward


def test_blocks_built_differently_are_refused():
  blocks = [nnx.Linear(3, 3, rngs=nnx.Rngs(0)),
            nnx.Linear(3, 3, use_bias=False, rngs=nnx.Rngs(0))]
  with pytest.raises(ValueError, match="scan_layers.*built alike"):
    scan_layers(blocks, 2, lambda block, h, m, v: (block(h), {}), jnp.zeros((1, 3)),
                jnp.zeros((2, 1, 0, 3)), jnp.zeros((), jnp.int32))
