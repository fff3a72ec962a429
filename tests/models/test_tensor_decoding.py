"""Decoding on a tensor mesh (8 simulated CPU devices) equals one device: Scaling Transformers'
17B block (d_model 9216, d_ff 49152 in blocks of 256, 96 heads, S = 64) scaled down 48 times
in width (d_model 192, d_ff 1024 in blocks of 16; 24 heads and S = 16, the 17B's 3 heads to 2
modules, so a head straddles modules; whole blocks, modules and heads on each of 8 devices),
dense and with sparse FF + sparse QKV at batch 1 on `tensor=8`, and the sparse one at batch 2
on `data=2,tensor=4` (the rows split too); a SwitchHead LM and Transformer-XL LMs (dense and
sigma-MoE FF, decoding through the XL memory) on `tensor=8`.

Tolerances: the mesh changes only the order of float32 sums (each device's partial products
over its heads or hidden units, then an all-reduce), so the logits agree to a few ulps of
their magnitude (rtol 1e-5, atol 1e-5 of the largest) and greedy tokens are the same unless
two logits tie to that precision (none does for these random weights).
"""

import jax
import numpy as np
import pytest
from flax import nnx
from lm_testing import decode_all

import sparse_jax
from benchmarks.decode import model_config
from sparse_jax import parallel
from sparse_jax.aot.collectives import collectives
from sparse_jax.decoding import on_mesh
from sparse_jax.models import TransformerLM

SHAPE_17B_SCALED = dict(d_model=192, n_heads=24, attention_sparsity=16, d_ff=1024,
                        block_size=16)
MESHES = {"tensor8": ((1, 1, 1, 8), 1), "data2_tensor4": ((2, 1, 1, 4), 2)}


def build(variant):
  lm = TransformerLM(model_config(variant, SHAPE_17B_SCALED, n_layers=2), rngs=nnx.Rngs(0))
  lm.eval()
  return lm


def assert_decodes_like_one_device(lm, batch, shape):
  """Greedy tokens of `generate` on a mesh of `shape` equal one device's, and so do the logits
  of every position fed through the decode cache."""
  prompt = jax.random.randint(jax.random.key(1), (batch, 2), 0, 256)
  want_tokens = sparse_jax.generate(lm, prompt, 4, temperature=0.0)
  want_logits = decode_all(lm, want_tokens)
  mesh = parallel.make_mesh(shape)
  np.testing.assert_array_equal(sparse_jax.generate(lm, prompt, 4, temperature=0.0, mesh=mesh),
                                want_tokens)
  with jax.set_mesh(mesh):
    logits = decode_all(on_mesh(lm, mesh), want_tokens)
  atol = 1e-5 * float(np.abs(want_logits).max())
  np.testing.assert_allclose(logits, want_logits, rtol=1e-5, atol=atol)


@pytest.mark.parametrize("variant, mesh_name", [
    ("dense", "tensor8"), ("sparse_ff_qkv", "tensor8"), ("sparse_ff_qkv", "data2_tensor4")])
def test_decoding_on_a_tensor_mesh_equals_one_device(variant, mesh_name):
  shape, batch = MESHES[mesh_name]
  assert_decodes_like_one_device(build(variant), batch, shape)


def test_a_decoded_token_moves_activations_not_weights():
  """The compiled decode step of the sparse FF + QKV LM on `tensor=8`: per layer one
  all-reduce of `d_model` (the FF's partial outputs), one all-gather of `d_model` (the
  attention's heads; it has no output layer) and the sparse QKV convolutions' neighbouring
  modules (collective-permutes of F_len x M); no array as large as a weight's row block (a
  flat gather of the sparse FF's chosen rows all-reduced `2 d_ff / N` rows of `d_model`)."""
  lm, mesh = build("sparse_ff_qkv"), parallel.make_mesh((1, 1, 1, 8))
  with jax.set_mesh(mesh):
    lm = on_mesh(lm, mesh)
    graphdef, state = nnx.split(lm)
    cache = lm.init_cache(1, 16)
    step = jax.jit(lambda state, cache, tokens: nnx.merge(graphdef, state).decode_step(
        tokens, cache))
    hlo = step.lower(state, cache, jax.numpy.zeros((1, 1), jax.numpy.int32)).compile().as_text()
  found = collectives(hlo)
  d_bytes = 192 * 4
  assert max(c.nbytes for c in found) == d_bytes
  kinds = [c.kind for c in found if c.nbytes == d_bytes]
  # Two layers: the FF's and the heads' per layer, and the embedding's vocabulary slices.
  assert sorted(kinds) == ["all-gather"] * 2 + ["all-reduce"] * 3
  assert [c.shape for c in found if c.kind == "collective-permute"] == [(1, 3, 1, 12)] * 4


def test_switchhead_decodes_on_a_tensor_mesh_like_one_device():
  """SwitchHead attention (8 heads, 4 V and O experts each) split by head over `tensor=8`:
  each device runs its heads' experts (`expert_parallel.head_parallel`)."""
  cfg = dict(vocab_size=256, d_model=64, n_layers=2, n_heads=8, mem_len=0, dropout=0.0,
             attention="switchhead", attention_experts=4, attention_k=2,
             ff={"kind": "dense", "d_ff": 128})
  lm = TransformerLM(cfg, rngs=nnx.Rngs(0))
  lm.eval()
  assert_decodes_like_one_device(lm, 1, MESHES["tensor8"][0])


@pytest.mark.parametrize("ff", [{"kind": "dense", "d_ff": 128},
                                {"kind": "sigma_moe", "n_experts": 4, "expert_size": 16,
                                 "k": 2, "reg_coef": 0.0}], ids=["dense", "sigma_moe"])
def test_the_xl_lm_decodes_on_a_tensor_mesh_like_one_device(ff):
  """Transformer-XL attention (8 heads) decodes through its memory of hidden states, which
  every device of `tensor=8` holds whole; the heads, the FF's hidden units (the experts'
  columns) and the vocabulary split as in training."""
  cfg = dict(vocab_size=256, d_model=64, n_layers=2, n_heads=8, mem_len=16, dropout=0.0,
             attention="xl", ff=ff)
  lm = TransformerLM(cfg, rngs=nnx.Rngs(0))
  lm.eval()
  assert_decodes_like_one_device(lm, 1, MESHES["tensor8"][0])
