"""The config check of tensor parallelism: what `mesh.tensor` > 1 refuses, naming the field."""

import pytest
from hf_testing import reference_copy
from lm_testing import tiny_lm_config

from sparse_jax import parallel
from sparse_jax.configs import glue, tensor_parallel, terraformer_arithmetic
from sparse_jax.models.encoder import roberta_base_config
from sparse_jax.models.lm_config import ModelConfig
from sparse_jax.models.tensor_support import check_tensor_parallel
from sparse_jax.tasks import task_for, validate_config
from sparse_jax.training.placement import Placement
from sparse_jax.validation import ConfigError


@pytest.fixture
def config(tmp_path):
  """The tiny sigma-MoE LM on tensor 2 (heads 2, experts of 16, vocabulary 256 divide)."""
  config = tiny_lm_config(str(tmp_path), str(tmp_path / "tfds"))
  config.mesh.tensor = 2
  return config


def test_the_tested_kinds_pass(config):
  validate_config(config)
  config.model.update(attention="causal")
  config.model.ff = {"kind": "dense", "d_ff": 64}
  config.mesh.update(data=2, expert=1)
  validate_config(config)
  config.model.ff = {"kind": "topk", "d_ff": 64, "k": 8}
  config.model.memory = {"kind": "spartan", "n_parents": 4, "n_children": 2, "top_k": 2}
  config.model.adapters = {"kind": "pfeiffer", "bottleneck": 4}
  validate_config(config)
  # PKM: 25 values and 3 heads that tensor 2 does not divide stay whole on each device.
  config.model.ff = {"kind": "pkm", "n_subkeys": 5, "knn": 2, "n_heads": 3}
  validate_config(config)
  config.model.update(attention="sparse_qkv", mem_len=0, n_heads=4, attention_sparsity=2)
  config.model.ff = {"kind": "sparse_ff", "d_ff": 64, "block_size": 32}
  validate_config(config)
  config.model.update(attention="switchhead", attention_sparsity=None, attention_experts=2,
                      attention_k=1, layer_groups=1, block_norm="peri")
  config.model.ff = {"kind": "sigma_moe", "n_experts": 4, "expert_size": 16, "k": 2,
                     "reg_coef": 0.001}
  validate_config(config)


@pytest.mark.parametrize("change, message", [
    ({"ff": {"kind": "topk", "d_ff": 63, "k": 4}},
     r"'model.ff.d_ff' must be divisible by mesh.tensor=2"),
    ({"attention": "switchhead", "mem_len": 0, "attention_experts": 2, "attention_k": 1,
      "attention_impl": "mosaic"},
     r"'model.attention_impl' must be one of \('auto', 'blocked', 'ragged', 'gather', "
     r"'pallas', 'megablox'\) with "
     r"SwitchHead attention with mesh.tensor=2"),
    ({"vocab_size": 258, "loss_sparsity": 3},
     r"'model.loss_sparsity' must be divisible by mesh.tensor=2"),
    ({"n_heads": 1}, r"'model.n_heads' must be divisible by mesh.tensor=2.*got 1"),
    ({"vocab_size": 257}, r"'model.vocab_size' must be divisible by mesh.tensor=2"),
    ({"ff.expert_size": 15}, r"'model.ff.expert_size' must be divisible by mesh.tensor=2"),
    ({"ff.impl": "mosaic"}, r"'model.ff.impl' must be one of \('auto', 'blocked', 'ragged', "
                            r"'gather', 'pallas', 'megablox'\) with mesh.tensor=2"),
    ({"ff": {"kind": "dense", "d_ff": 63}}, r"'model.ff.d_ff' must be divisible by mesh.tensor"),
    ({"ff": {"kind": "sparse_ff", "d_ff": 64, "block_size": 64}},
     r"'model.ff.block_size' must be a block size giving a number of blocks d_ff / block_size "
     r"divisible by mesh.tensor=2 \(whole blocks per device; d_ff=64\).*got 64"),
    ({"attention": "sparse_qkv", "mem_len": 0, "n_heads": 4, "attention_sparsity": 1},
     r"'model.attention_sparsity' must be divisible by mesh.tensor=2"),
])
def test_what_is_not_split_yet_is_refused_naming_the_field(config, change, message):
  for field, value in change.items():
    if field.startswith("ff."):
      config.model.ff[field[3:]] = value
    else:
      config.model[field] = value
  with pytest.raises(ConfigError, match=message):
    validate_config(config)
  config.mesh.tensor = 1
  if "divisible" in message:
    validate_config(config)  # Only the split needed it.


@pytest.mark.parametrize("impl", ["pallas", "megablox"])
def test_the_kernels_split_over_tensor_pass(config, impl):
  """The Triton and megablox expert kernels and the fused XL attention (tests/training/
  test_tensor_parallel_kernels.py)."""
  config.model.update(attention_impl="pallas", attn_dropout=0.0)
  config.model.ff.impl = impl
  validate_config(config)


@pytest.mark.parametrize("variant", tensor_parallel.VARIANTS)
def test_the_tensor_parallel_configs_pass_the_check(variant):
  config = tensor_parallel.get_config(variant)
  validate_config(config)
  assert config.mesh.tensor == tensor_parallel.TENSOR


@pytest.mark.parametrize("method", ["spartan", "houlsby", "pfeiffer", "full", "head"])
@pytest.mark.parametrize("backbone", ["hf_roberta", "lm_checkpoint"])
def test_fine_tuning_on_tensor_takes_every_method_and_backbone(method, backbone):
  """The backbone's own fields are checked when the task meets its mesh (below)."""
  config = glue.get_config(f"rte,{method}")
  config.backbone.kind = backbone
  config.mesh.tensor = 2
  validate_config(config)


def test_the_encoders_own_fields_are_checked():
  """The RoBERTa encoder (checked when the task meets its mesh: its fields are the
  backbone's config.json's) must split its heads and `d_ff` evenly; its vocabulary need not
  (roberta-base's 50265: the table then stays whole on each device of `tensor`, as
  `parallel.RULES` leave a dimension no rule divides; no output layer reads it)."""
  encoder = ModelConfig.parse(roberta_base_config(), "model")  # 12 heads, d_ff 3072
  check_tensor_parallel(encoder, 4)
  with pytest.raises(ConfigError, match=r"'model.n_heads' must be divisible by mesh.tensor=8"):
    check_tensor_parallel(encoder, 8)


def test_fine_tuning_checks_the_backbones_fields_on_its_mesh(tmp_path):
  """The tiny RoBERTa's 4 heads split over tensor 4 but not 8: refused when the task meets
  the mesh (`check_mesh` reads the backbone's config.json)."""
  config = glue.get_config("rte,full")
  config.backbone.path = reference_copy("roberta_320", tmp_path)
  config.train.batch_size = config.eval.batch_size = 8
  task = task_for(config)
  task.check_mesh(Placement(parallel.make_mesh((1, 1, 1, 4))))
  with pytest.raises(ConfigError, match=r"'model.n_heads' must be divisible by mesh.tensor=8"):
    task.check_mesh(Placement(parallel.make_mesh((1, 1, 1, 8))))


def test_the_seq2seq_terraformer_refuses_tensor():
  config = terraformer_arithmetic.get_config()
  config.mesh.tensor = 2
  with pytest.raises(ConfigError, match=r"'mesh.tensor' must be 1 with the seq2seq "
                                        r"Terraformer \(only the decoder LM and the RoBERTa "
                                        r"encoder are split over tensor so far\)"):
    validate_config(config)
