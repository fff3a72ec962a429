"""Every feed-forward kind inside TransformerLM: one jitted training step; accounting."""

import jax
import ml_collections
import numpy as np
import optax
import pytest
from flax import nnx

from sparse_jax.layers import ff_kinds
from sparse_jax.models import TransformerLM
from sparse_jax.models.accounting import matched_dense_config, matched_dense_d_ff, model_report
from sparse_jax.models.rngs import make_rngs
from sparse_jax.training.steps import make_train_step

FF_CONFIGS = {
    "dense": dict(d_ff=64),
    "topk": dict(d_ff=64, k=8),
    "pkm": dict(n_subkeys=8, knn=4, n_heads=2),
    "sigma_moe": dict(n_experts=4, expert_size=16, k=2, reg_coef=0.001, expert_dropout=0.1),
    "switch": dict(n_experts=4, expert_size=16, capacity_factor=1.25, reg_coef=0.01,
                   expert_hidden_dropout=0.2),
    "noisy_topk": dict(n_experts=4, expert_size=16, k=2, reg_coef=0.01),
    "sbase": dict(n_experts=4, expert_size=16, k=2, reg_coef=0.001),
    "softmax_moe": dict(n_experts=4, expert_size=16, k=2, renorm=True, reg_coef=0.001),
    "sparse_ff": dict(d_ff=64, block_size=8, quant_prob=1.0),
}


def lm_loss(model, batch, memory):
  """Next-token cross-entropy plus the FF regularisers, in the step factory's loss shape."""
  logits, new_memory, aux = model(batch["inputs"], memory)
  ce = optax.softmax_cross_entropy_with_integer_labels(logits, batch["targets"]).mean()
  return ce + aux["reg_loss"], ({"ce": ce}, new_memory)


def lm_config(kind):
  return ml_collections.ConfigDict(dict(
      vocab_size=40, d_model=16, n_layers=2, n_heads=2, mem_len=6, dropout=0.1,
      ff=dict(kind=kind, **FF_CONFIGS[kind])))


def test_every_registered_kind_is_covered():
  assert sorted(FF_CONFIGS) == ff_kinds()


@pytest.mark.parametrize("kind", sorted(FF_CONFIGS))
def test_one_jitted_training_step(kind):
  model = TransformerLM(lm_config(kind), rngs=make_rngs(0))
  optimizer = nnx.Optimizer(model, optax.adam(1e-2), wrt=nnx.Param)
  graphdef, state = nnx.split((model, optimizer))
  before = jax.tree.map(np.array, nnx.to_pure_dict(nnx.state(model, nnx.Param)))
  step = make_train_step(graphdef, lm_loss, seed=0)
  tokens = jax.random.randint(jax.random.key(1), (2, 7), 0, 40)
  batch = {"inputs": tokens[:, :-1], "targets": tokens[:, 1:]}
  state, memory, metrics = step(nnx.to_pure_dict(state), model.init_memory(2), batch, 0)
  assert np.isfinite(float(metrics["loss"])) and float(metrics["grad_norm"]) > 0
  # The state comes back as nested dicts of arrays, the form the step takes (no Variables).
  is_variable = lambda x: isinstance(x, nnx.Variable)  # noqa: E731
  assert not any(map(is_variable, jax.tree.leaves(state, is_leaf=is_variable)))
  nnx.update((model, optimizer), state)
  after = nnx.to_pure_dict(nnx.state(model, nnx.Param))
  changed = jax.tree.map(lambda a, b: bool(np.any(a != np.asarray(b))), before, after)
  assert changed["blocks"][0]["ff"] and any(jax.tree.leaves(changed["blocks"][0]["ff"]))
  assert int(memory.valid) == 6


def test_matched_dense_reproduces_the_papers_wt_s_baseline():
  """Table 6/7: sigma-MoE WT-S (d_model 412, 16 experts of 128) <-> dense d_ff 2053."""
  cfg = lm_config("sigma_moe")
  cfg.update(d_model=412, n_layers=16, n_heads=10, head_dim=41, vocab_size=8000)
  cfg.ff.update(n_experts=16, expert_size=128, k=4)
  assert matched_dense_d_ff(cfg) == 2053
  sparse = model_report(cfg)
  dense = model_report(matched_dense_config(ml_collections.ConfigDict({"model": cfg})).model)
  assert abs(sparse["total_params"] - dense["total_params"]) < 0.01 * dense["total_params"]
  assert sparse["total_params"] == pytest.approx(47e6, rel=0.02)  # the paper's "47M"
  assert sparse["ff_flops_percent_of_dense"] == pytest.approx(25.3, abs=0.1)


@pytest.mark.parametrize("attention,extra", [("causal", dict(positions="sinusoidal")),
                                             ("sparse_qkv", dict(loss_sparsity=4))])
def test_one_training_step_for_each_attention_kind(attention, extra):
  cfg = lm_config("sparse_ff")
  cfg.update(attention=attention, **extra)
  model = TransformerLM(cfg, rngs=make_rngs(0))
  optimizer = nnx.Optimizer(model, optax.adam(1e-2), wrt=nnx.Param)
  graphdef, state = nnx.split((model, optimizer))
  tokens = jax.random.randint(jax.random.key(2), (2, 7), 0, 40)
  batch = {"inputs": tokens[:, :-1], "targets": tokens[:, 1:]}
  _, memory, metrics = make_train_step(graphdef, lm_loss, seed=0)(
      nnx.to_pure_dict(state), model.init_memory(2), batch, 0)
  assert np.isfinite(float(metrics["loss"])) and float(metrics["grad_norm"]) > 0
  assert memory.mem_len == 0  # only XL attention carries memory


def test_scaling_transformer_configs_keep_the_parameter_count():
  from sparse_jax.configs import scaling_small

  dense = model_report(scaling_small.get_config("dense").model)["total_params"]
  for variant in scaling_small.VARIANTS[1:]:
    config = scaling_small.get_config(variant)
    assert abs(model_report(config.model)["total_params"] - dense) < 0.04 * dense, variant
  assert scaling_small.get_config("qkv").model.ff.d_ff > 1024  # d_ff raised, as in the paper
