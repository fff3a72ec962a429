"""`model.dtype = "bfloat16"` computes in bfloat16: proved on the lowered training step of every
model and FF kind (`aot.matmul_dtypes`), with float32 parameters and optimiser state."""

import importlib
import os

import jax
import jax.numpy as jnp
import pytest

from sparse_jax import parallel
from sparse_jax.aot import matmul_dtypes
from sparse_jax.layers import ff_kinds
from sparse_jax.tasks import backbones, task_for
from sparse_jax.training.compile_only import trace_train_step
from sparse_jax.training.placement import Placement

# Every FF kind at a width where its matmuls are not dwarfed by the router or the output.
LM_FF = {
    "dense": dict(d_ff=512),
    "topk": dict(d_ff=512, k=64),
    "pkm": dict(n_subkeys=16, knn=8, n_heads=2),
    "sigma_moe": dict(n_experts=8, expert_size=64, k=2, reg_coef=0.001),
    "switch": dict(n_experts=8, expert_size=64, capacity_factor=1.25, reg_coef=0.01),
    "noisy_topk": dict(n_experts=8, expert_size=64, k=2, reg_coef=0.01),
    "sbase": dict(n_experts=8, expert_size=64, k=2, reg_coef=0.001),
    "softmax_moe": dict(n_experts=8, expert_size=64, k=2, renorm=True, reg_coef=0.001),
    "sparse_ff": dict(d_ff=512, block_size=16),
}
# Matmuls left in float32 by design, each a small part of the step: Terraformer's SRU gates
# (the recurrence's cell dtype) and LSH's hashing rotations (bucket choices), the
# classifier's pooling and head. Together under 3% of the step's matmul FLOPs here.
F32_SHARE_MAX = 0.03


ROBERTA = os.path.join(os.path.dirname(__file__), "..", "data", "hf_reference", "roberta_320")


def _config(spec: str, **overrides):
  path, _, arg = spec.partition(":")
  module = importlib.import_module(f"sparse_jax.configs.{path}")
  config = module.get_config(arg) if arg else module.get_config()
  for dotted, value in overrides.items():
    section = config
    *parents, leaf = dotted.split(".")
    for name in parents:
      section = section[name]
    section[leaf] = value
  if "model" in config:  # Fine-tuning sets it in `backbone.dtype`.
    config.model.dtype = "bfloat16"
  return config


def _lm(ff_kind: str = "sigma_moe", **overrides):
  return _config("default", **{"model.n_layers": 2, "data.batch_size": 4,
                               "data.seq_len": 64, "model.mem_len": 64,
                               "model.ff": {"kind": ff_kind, **LM_FF[ff_kind]}, **overrides})


CASES = {
    **{f"lm_{kind}": (lambda kind=kind: _lm(kind)) for kind in LM_FF},
    "lm_causal_sparse_output": lambda: _lm(**{"model.attention": "causal",
                                              "model.loss_sparsity": 4}),
    "lm_sparse_qkv": lambda: _lm(**{"model.attention": "sparse_qkv",
                                    "model.attention_sparsity": 4}),
    "lm_tied": lambda: _lm(**{"model.tie_embeddings": True}),
    "wt103_s": lambda: _config("sigma_moe_paper:wt103_s", **{"model.n_layers": 2,
                                                             "data.batch_size": 8}),
    "spartan_encoder": lambda: _config("glue:mrpc", **{
        "train.batch_size": 4, "backbone.path": ROBERTA, "backbone.dtype": "bfloat16"}),
    "spartan_lm_backbone": lambda: _config("spartan_stdlib", **{
        "train.batch_size": 4, "backbone.dtype": "bfloat16"}),
    "terraformer": lambda: _config("terraformer_arithmetic:copy"),
    "terraformer_sparse_qkv": lambda: _config("terraformer_arxiv", **{
        "model.n_encoder_layers": 1, "model.n_decoder_layers": 1, "data.batch_size": 2}),
    "transformer_baseline": lambda: _config("terraformer_arithmetic:copy,transformer"),
}


def _lowered_step(config):
  task = task_for(config)
  mesh = parallel.make_mesh((1, 1, 1), jax.devices()[:1])
  with jax.set_mesh(mesh):
    traced, _, state, _ = trace_train_step(task, Placement(mesh))
    return traced.lower().as_text(), state


def test_every_ff_kind_is_covered():
  assert sorted(LM_FF) == ff_kinds()


@pytest.mark.parametrize("name", sorted(CASES))
def test_bfloat16_training_step_multiplies_in_bfloat16(name, monkeypatch):
  # The byte-LM backbone's architecture, as a float32 checkpoint of sparse_jax/configs/default.py saves it.
  saved = _lm().model
  saved.dtype = "float32"
  monkeypatch.setattr(backbones, "backbone_model_config", lambda cfg: saved)
  text, state = _lowered_step(CASES[name]())
  found = matmul_dtypes.contractions(text)
  total = sum(c.flops for c in found)
  wide = [c for c in found if "bf16" not in (c.lhs_dtype, c.rhs_dtype)]
  mixed = [c for c in found if c.lhs_dtype != c.rhs_dtype]
  assert not mixed, mixed  # A bf16 x f32 matmul would be promoted: the policy leaked.
  assert sum(c.flops for c in wide) <= F32_SHARE_MAX * total, matmul_dtypes.describe(found)
  floats = [x for x in jax.tree.leaves(state) if jnp.issubdtype(x.dtype, jnp.floating)]
  assert floats and all(x.dtype == jnp.float32 for x in floats), {x.dtype for x in floats}


def test_census_reads_operands_and_flops():
  """The parser on a program of known matmuls: `[8, 16] x [16, 4]` in bf16 (1024 FLOPs) and a
  convolution of a `[2, 3, 10]` input with a `[5, 3, 3]` kernel in f32 (2 * 2*5*8 * 3*3)."""
  def f(a, b, x, w):
    return a @ b, jax.lax.conv_general_dilated(x, w, (1,), "VALID")
  text = jax.jit(f).lower(jnp.ones((8, 16), jnp.bfloat16), jnp.ones((16, 4), jnp.bfloat16),
                          jnp.ones((2, 3, 10)), jnp.ones((5, 3, 3))).as_text()
  found = matmul_dtypes.contractions(text)
  assert [(c.op, c.operands, c.flops) for c in found] == [
      ("dot_general", "bf16 x bf16", 2 * 8 * 4 * 16),
      ("convolution", "f32 x f32", 2 * (2 * 5 * 8) * (3 * 3))]
  assert matmul_dtypes.flops_by_operands(found) == pytest.approx(
      {"bf16 x bf16": 1024 / 2464, "f32 x f32": 1440 / 2464})


def test_a_float32_model_stays_float32():
  config = _lm()
  config.model.dtype = "float32"
  found = matmul_dtypes.contractions(_lowered_step(config)[0])
  assert found and all(c.operands == "f32 x f32" for c in found)
