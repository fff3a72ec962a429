"""Typed config schemas: the parsing machinery, every section's schema, kind switching on the
command line, derived values and every LM config file."""

from typing import Literal

import ml_collections
import pytest

from sparse_jax.configs import (default, default_dense, dense_paper, e8_dense, moe_variants, moeut_paper,
                     quality_medium, quality_small, scaling_small, sigma_moe_paper,
                     wt103_b_dense, wt103_b_one_gpu, wt103_s_dense, wt103_s_embedded)
from sparse_jax import schema, validation
from sparse_jax.config_overrides import switch_kinds, tagged_sections
from sparse_jax.data import classification, datasets
from sparse_jax.layers import registry
from sparse_jax.models import classifier, encoder, lm_config, plugins
from sparse_jax.models.accounting import model_report
from sparse_jax.validation import ConfigError


class Inner(schema.Schema):
  size: schema.PositiveInt = 3


class Shape(schema.Schema, tag="kind", default="square"):
  kind: str
  inner: Inner


@Shape.variant("square")
class Square(Shape):
  side: float = 1.0


@Shape.variant("box", "crate")
class Box(Shape):
  dims: tuple[schema.PositiveInt, ...]
  label: str | None = None
  color: Literal["red", "blue"] = "red"
  solid: bool = True

  def check(self, path: str) -> None:
    if len(self.dims) > 3:
      raise ConfigError(f"config field '{path}.dims' has {len(self.dims)} > 3 items.")


def error(fn, *args) -> str:
  with pytest.raises(ConfigError) as caught:
    fn(*args)
  return str(caught.value)


# The machinery.

def test_unknown_field_names_the_path_and_the_nearest_valid_field():
  message = error(Shape.parse, {"kind": "box", "dims": [1], "colour": "red"}, "shape")
  assert message.startswith("config field 'shape.colour' is unknown for shape.kind='box'; "
                            "did you mean 'color'?")
  assert "Valid fields: color, dims, inner, kind, label, solid." in message
  assert "did you mean" not in error(Shape.parse, {"zzz": 1}, "shape")


def test_types_follow_the_annotations():
  box = Shape.parse(ml_collections.ConfigDict({"kind": "box", "dims": [2, 3]}), "shape")
  assert box == Box(kind="box", inner=Inner(), dims=(2, 3))  # list -> tuple, defaults filled
  assert Shape.parse({"side": 2}, "s").side == 2.0 and isinstance(Shape.parse(
      {"side": 2}, "s").side, float)  # float takes an int; the default tag is "square"
  assert "'s.side' must be a number; got True" in error(Shape.parse, {"side": True}, "s")
  assert "'s.solid' must be True or False; got 1" in error(
      Shape.parse, {"kind": "box", "dims": [1], "solid": 1}, "s")
  assert "'s.color' must be one of ['red', 'blue']; got 'green'" in error(
      Shape.parse, {"kind": "box", "dims": [1], "color": "green"}, "s")
  assert "'s.label' must be a string or None; got 3" in error(
      Shape.parse, {"kind": "box", "dims": [1], "label": 3}, "s")
  assert "'s.dims' must be a tuple whose items are each a positive integer; got [1, 0]" in (
      error(Shape.parse, {"kind": "box", "dims": [1, 0]}, "s"))
  assert "'s.inner.size' must be a positive integer; got 2.0" in error(
      Shape.parse, {"inner": {"size": 2.0}}, "s")


def test_required_fields_tags_and_check_hooks():
  assert "config field 's.dims' is required for s.kind='crate'" in error(
      Shape.parse, {"kind": "crate"}, "s")
  assert "config field 's.kind' must be one of ['box', 'crate', 'square']; got 'ball'" in error(
      Shape.parse, {"kind": "ball"}, "s")
  assert "has 4 > 3 items" in error(Shape.parse, {"kind": "box", "dims": [1, 1, 1, 1]}, "s")
  assert Box.parse({"dims": [1], "kind": "crate"}, "s").kind == "crate"  # a variant, directly
  assert "must be one of ['box', 'crate']" in error(Box.parse, {"kind": "square"}, "s")
  assert "'s.kind' must be one of ['square']" in error(Square.parse, {"kind": "box"}, "s")


def test_nested_sections_instances_and_to_dict():
  square = Shape.parse({}, "s")  # an absent nested section parses as {}
  assert square == Square(kind="square", inner=Inner(size=3), side=1.0)
  assert Shape.parse(square, "s") is square
  assert square.to_dict() == {"kind": "square", "inner": {"size": 3}, "side": 1.0}
  assert Shape.parse(square.to_dict(), "s") == square
  assert Shape.subsections() == {"inner": Inner}
  assert "config section 's' must be a mapping" in error(Shape.parse, 3, "s")


# Feed-forward kinds: one schema each, registered with its builder.

MINIMAL_FF = {
    "dense": dict(d_ff=8),
    "topk": dict(d_ff=8, k=2),
    "pkm": dict(n_subkeys=4, knn=2),
    "sigma_moe": dict(n_experts=4, expert_size=8, k=2, reg_coef=0.001),
    "switch": dict(n_experts=4, expert_size=8, reg_coef=0.01),
    "noisy_topk": dict(n_experts=4, expert_size=8, k=2, reg_coef=0.01),
    "sbase": dict(n_experts=4, expert_size=8, k=2, reg_coef=0.0),
    "softmax_moe": dict(n_experts=4, expert_size=8, k=2, renorm=True, reg_coef=0.0),
    "sparse_ff": dict(d_ff=16, block_size=4),
}


@pytest.mark.parametrize("kind", registry.ff_kinds())
def test_every_ff_kind_has_a_schema_with_required_fields(kind):
  ff = registry.parse_ff({"kind": kind, **MINIMAL_FF[kind]})
  assert type(ff) is registry.FFConfig.variants()[kind] and ff.kind == kind
  for name in MINIMAL_FF[kind]:
    fields = {"kind": kind, **MINIMAL_FF[kind]}
    del fields[name]
    assert f"'model.ff.{name}' is required for model.ff.kind='{kind}'" in error(
        registry.parse_ff, fields)


def test_ff_defaults_live_in_their_schemas():
  assert registry.parse_ff({"kind": "pkm", **MINIMAL_FF["pkm"]}) == registry.PKMConfig(
      kind="pkm", n_subkeys=4, knn=2, n_heads=4, activation="relu", init="authors",
      dense_when_knn_covers=True)
  switch = registry.parse_ff({"kind": "switch", **MINIMAL_FF["switch"]})
  assert (switch.init, switch.impl, switch.expert_hidden_dropout, switch.capacity_factor,
          switch.balance) == ("switch", "auto", 0.0, None, "authors")
  sbase = registry.parse_ff({"kind": "sbase", **MINIMAL_FF["sbase"]})
  assert (sbase.sinkhorn_iters, sbase.balance_over, sbase.sinkhorn) == (3, "sequence", "authors")
  sparse = registry.parse_ff({"kind": "sparse_ff", **MINIMAL_FF["sparse_ff"]})
  assert (sparse.d_lowrank, sparse.temperature, sparse.quant_prob) == (None, 0.1, 0.3)


@pytest.mark.parametrize("kind,fields,named,allowed", [
    ("sigma_moe", dict(n_expert=4), "model.ff.n_expert", "did you mean 'n_experts'?"),
    ("sigma_moe", dict(k=5), "model.ff.k", "an integer in [1, model.ff.n_experts=4]"),
    ("topk", dict(k=9), "model.ff.k", "an integer in [1, model.ff.d_ff=8]"),
    ("pkm", dict(knn=17), "model.ff.knn", "an integer in [1, model.ff.n_subkeys^2=16]"),
    ("pkm", dict(activation="gelu"), "model.ff.activation", "one of ['relu', 'softmax']"),
    ("switch", dict(capacity_factor=0), "model.ff.capacity_factor", "a positive number"),
    ("sbase", dict(reg_coef=-1.0), "model.ff.reg_coef", "a number >= 0"),
    ("softmax_moe", dict(renorm="yes"), "model.ff.renorm", "True or False"),
    ("noisy_topk", dict(impl="cuda"), "model.ff.impl", "one of ['auto', 'pallas'"),
    ("sigma_moe", dict(expert_dropout=1.0), "model.ff.expert_dropout", "in [0, 1)"),
    ("sparse_ff", dict(block_size=5), "model.ff.block_size",
     "a positive divisor of model.ff.d_ff=16"),
    ("sparse_ff", dict(quant_prob=1.5), "model.ff.quant_prob", "in [0, 1]"),
    ("dense", dict(activation="tanh"), "model.ff.activation", "one of ['relu', 'gelu', 'swish']"),
])
def test_bad_ff_fields_name_the_field_and_what_is_allowed(kind, fields, named, allowed):
  message = error(registry.parse_ff, {"kind": kind, **MINIMAL_FF[kind], **fields})
  assert f"'{named}'" in message and allowed in message


def test_an_unknown_ff_kind_lists_the_registered_ones():
  message = error(registry.parse_ff, {"kind": "sigmoe"})
  assert f"'model.ff.kind' must be one of {registry.ff_kinds()}" in message


# The model section: LM and encoder kinds, plug-ins.

def test_the_default_model_section_parses_with_every_default_once():
  model = lm_config.validate_model_config(default.get_config().model)
  assert isinstance(model, lm_config.LMConfig) and isinstance(model.ff, registry.SigmaMoEConfig)
  assert (model.attention, model.positions, model.dtype, model.loss_sparsity,
          model.tie_embeddings, model.head_dim) == ("xl", "rotary", "float32", 0, False, None)
  assert model.memory == plugins.NoMemoryConfig(kind="none")
  assert model.adapters == plugins.NoAdapterConfig(kind="none")
  assert lm_config.validate_model_config(model.to_dict()) == model


@pytest.mark.parametrize("change,message", [
    (dict(d_model=250), "'model.d_model' must be divisible by model.n_heads=4 (or set "
                        "model.head_dim, except for sparse_qkv attention); got 250."),
    (dict(atention="causal"), "'model.atention' is unknown for model.kind='lm'; did you mean "
                              "'attention'?"),
    (dict(attention="local"), "'model.attention' must be one of ['xl', 'causal', 'sparse_qkv', 'switchhead', 'switchhead_xl']"),
    (dict(loss_sparsity=3), "'model.loss_sparsity' must be 0 (dense) or a divisor of "
                            "model.vocab_size=256"),
    (dict(kind="encoder"), "'model.kind' must be one of ['lm']"),
    (dict(adapters={"kind": "houlsby", "bottleneck": 8, "init": "zeros"}),
     "'model.adapters.init' must be one of"),
    (dict(memory={"kind": "spartan", "n_parents": 4, "n_children": 2, "top_k": 5}),
     "'model.memory.top_k' must be at most model.memory.n_parents=4"),
    (dict(ff={"kind": "pkm", "n_subkeys": 4, "knn": 2}, d_model=255, n_heads=5),
     "'model.d_model' must be even for a PKM"),
])
def test_bad_model_fields_name_the_field(change, message):
  cfg = default.get_config().model
  for name, value in change.items():
    cfg[name] = value
  assert message in error(lm_config.validate_model_config, cfg)


def test_the_encoder_kind_and_the_spartan_memory():
  cfg = encoder.roberta_base_config()
  cfg.memory = {"kind": "spartan", "n_parents": 16, "n_children": 3, "top_k": 8}
  cfg.adapters = {"kind": "pfeiffer", "bottleneck": 64}
  model = lm_config.ModelConfig.parse(cfg, "model")
  assert isinstance(model, encoder.EncoderConfig) and model.pad_id == 1
  assert model.memory == plugins.SpartanMemoryConfig(
      kind="spartan", n_parents=16, n_children=3, top_k=8, temperature=1.0, read="auto")
  assert model.adapters.activation is None and model.adapters.setting("activation") == "relu"
  assert model.adapters.setting("original_ln_before")  # AdapterHub's Pfeiffer
  cfg.pad_id = 50265
  assert "'model.pad_id' must be a token id in [0, model.vocab_size=50265)" in error(
      classifier.build_backbone, cfg, None)


# Data and task sections.

def test_each_dataset_has_its_schema():
  streams = dict(batch_size=2, seq_len=8)
  assert datasets.parse({"name": "builtin", **streams}) == datasets.BuiltinData(
      name="builtin", **streams)
  enwik8 = datasets.parse({"name": "enwik8", "split_bytes": [10, 2, 2], **streams})
  assert enwik8.split_bytes == (10, 2, 2) and enwik8.download is True
  wt = datasets.parse({"name": "wikitext103", **streams})
  assert (wt.sp_vocab_size, wt.spec().unit, wt.spec().vocab_size) == (8000, "token", 8000)
  text = datasets.parse({"name": "text_files", "file": "a.txt",
                         "split_fractions": (0.8, 0.1, 0.1), **streams})
  assert (text.tokenizer, text.spec().unit) == ("bytes", "byte")
  assert "'data.train_file' is unknown for data.name='builtin'" in error(
      datasets.parse, {"name": "builtin", "train_file": "a.txt", **streams})
  assert "'data.batch_size' is required for data.name='builtin'" in error(
      datasets.parse, {"name": "builtin", "seq_len": 8})
  assert "'data.split_bytes' must be a tuple of 3 items" in error(
      datasets.parse, {"name": "enwik8", "split_bytes": [1, 2], **streams})


def test_where_the_text_is_is_needed_to_train_not_to_inspect():
  """A `text_files` config without its files fails for training, naming the field; the modes
  that read no data (`--print_params`, `--compile_only`: `validation.inspecting()`) accept it,
  and every other rule still holds there."""
  from sparse_jax.tasks import validate_config  # pylint: disable=import-outside-toplevel
  config = moeut_paper.get_config("44m,moeut")
  needs_files = "config field 'data.train_file' must be set, with data.validation_file"
  assert needs_files in error(validate_config, config)
  with validation.inspecting():
    assert not validation.reads_data()
    assert validate_config(config).data.file is None
    config.data.train_file = "train.txt"
    config.data.file = "all.txt"
    assert "'data.file' must be unset when" in error(validate_config, config)
    del config.data["train_file"]
    config.model.n_layers = 0
    assert "'model.n_layers' must be a positive integer" in error(validate_config, config)
  assert validation.reads_data()
  config.model.n_layers = 16
  config.data.file = None
  assert needs_files in error(validate_config, config)


def test_each_task_has_its_schema():
  glue = classification.parse({"name": "glue/rte", "max_len": 128})
  assert isinstance(glue, classification.GlueTaskConfig) and glue.download is True
  assert glue.n_train is None and glue.spec().num_classes == 2
  stdlib = classification.parse({"name": "stdlib_packages", "max_len": 256, "n_train": 200})
  assert stdlib.snippet_bytes == 256 and stdlib.spec().num_classes == len(stdlib.packages)
  assert "'task.source_root' is unknown for task.name='glue/rte'" in error(
      classification.parse, {"name": "glue/rte", "max_len": 8, "source_root": "x"})
  assert "'task.max_len' is required" in error(classification.parse, {"name": "glue/cola"})


# Kind switches on the command line, and derived values.

def test_the_tagged_sections_are_found_at_every_depth():
  paths = [path for path, _ in tagged_sections({"data": datasets.DataConfig,
                                                "model": lm_config.ModelConfig})]
  assert paths == ["data", "model", "model.ff", "model.memory", "model.adapters"]


def override(config, overrides):
  """What `--config.<path>=<value>` flags do to the loaded config, then the kind switches."""
  for path, value in overrides.items():
    *parents, name = path.split(".")
    section = config
    for parent in parents:
      section = section[parent]
    section[name] = value
  return switch_kinds(config, overrides)


def test_switching_the_dataset_keeps_only_the_new_datasets_fields():
  config = override(default.get_config(), {
      "data.name": "text_files", "data.train_file": "t", "data.validation_file": "v",
      "data.test_file": "e", "data.seq_len": 32})
  assert "source_root" not in config.data  # builtin's field, unknown to text_files
  data = datasets.parse(config.data)
  assert (data.train_file, data.batch_size, data.tokenizer) == ("t", 16, "bytes")
  assert config.eval.mem_len == 4 * 32


def test_switching_the_ff_kind_and_reporting_a_field_the_new_kind_lacks():
  config = override(default.get_config(), {"model.ff.kind": "dense", "model.ff.d_ff": 64})
  assert lm_config.validate_model_config(config.model).ff == registry.DenseFFConfig(kind="dense",
                                                                             d_ff=64)
  config = override(default.get_config(), {"model.ff.kind": "dense", "model.ff.d_ff": 64,
                                            "model.ff.n_experts": 8})
  assert "'model.ff.n_experts' is unknown for model.ff.kind='dense'" in error(
      lm_config.validate_model_config, config.model)


def test_no_switch_or_an_unknown_kind_changes_nothing():
  config = default.get_config()
  before = config.to_dict()
  switch_kinds(config, {"model.ff.k": 1, "data.name": "builtin_typo"})
  assert config.to_dict() == before
  override(config, {"model.ff.kind": "sigma_moe"})  # the same kind: all fields known
  assert config.to_dict() == before


def test_derived_values_follow_what_they_derive_from():
  config = default.get_config()
  assert (config.train.warmup_steps, config.eval.mem_len) == (40, 512)
  config.train.steps, config.data.seq_len = 20, 64
  assert (config.train.warmup_steps, config.eval.mem_len) == (2, 256)
  config.eval.mem_len = 100  # an explicit value wins
  assert config.eval.mem_len == 100 and config.data.seq_len == 64
  big = wt103_b_dense.get_config()
  assert (big.train.warmup_steps, big.eval.mem_len, big.eval.batch_size) == (4000, 2048, 4)
  big.data.update(batch_size=8, sp_vocab_size=4000)
  big.train.steps = 1000
  assert (big.train.warmup_steps, big.eval.batch_size, big.model.vocab_size) == (40, 4, 4000)
  assert default_dense.get_config().train.warmup_steps == 40


def _lm_configs():
  yield "default", default.get_config()
  yield "default_dense", default_dense.get_config()
  yield "quality_small", quality_small.get_config()
  for variant in quality_medium.VARIANTS:
    yield f"quality_medium:{variant}", quality_medium.get_config(variant)
  for variant in wt103_s_embedded.VARIANTS:
    yield f"wt103_s_embedded:{variant}", wt103_s_embedded.get_config(variant)
  yield "e8_dense", e8_dense.get_config()
  yield "wt103_s_dense", wt103_s_dense.get_config()
  yield "wt103_b_dense", wt103_b_dense.get_config()
  for model in sigma_moe_paper.MODELS:
    yield f"sigma_moe_paper:{model}", sigma_moe_paper.get_config(model)
    yield f"dense_paper:{model}", dense_paper.get_config(model)
  for model in sigma_moe_paper.MODELS:
    for variant in moe_variants.VARIANTS:
      if "pkm" in variant and model not in moe_variants.PKM_SUBKEYS:
        continue
      yield f"moe_variants:{model},{variant}", moe_variants.get_config(f"{model},{variant}")
  for variant in scaling_small.VARIANTS:
    yield f"scaling_small:{variant}", scaling_small.get_config(variant)
  for variant in wt103_b_one_gpu.VARIANTS:
    yield f"wt103_b_one_gpu:{variant}", wt103_b_one_gpu.get_config(variant)


def test_every_lm_config_file_fits_the_schemas():
  for name, config in _lm_configs():
    lm_config.validate_model_config(config.model)
    data = datasets.parse(config.data)
    assert config.model.vocab_size >= data.spec().vocab_size, name
    assert 0 <= config.train.warmup_steps < config.train.steps, name


def test_the_one_gpu_wt103_b_config_parses_with_its_memory_settings():
  """The settings `benchmarks/train_memory.py` found to fit an H100 at batch 64."""
  from sparse_jax.tasks import validate_config
  settings = {variant: validate_config(wt103_b_one_gpu.get_config(variant))
              for variant in wt103_b_one_gpu.VARIANTS}
  assert {v: (s.model.dtype, s.model.remat, s.train.grad_accum_steps, s.data.batch_size)
          for v, s in settings.items()} == {"remat": ("bfloat16", "dots", 1, 64),
                                            "accumulate": ("bfloat16", "none", 2, 64)}


# Tables 6 and 7: total parameters of each paper model (dense and sigma-MoE alike).
PAPER_PARAMS = {"wt103_s": 47e6, "wt103_s_star": 238e6, "wt103_b": 262e6, "e8": 41e6}


@pytest.mark.parametrize("model", sorted(PAPER_PARAMS))
def test_paper_configs_keep_the_parameter_counts_of_tables_6_and_7(model):
  dense = model_report(dense_paper.get_config(model).model)["total_params"]
  assert dense == pytest.approx(PAPER_PARAMS[model], rel=0.01)
  variants = ["sigma_moe", "switch"]  # the other MoE routers add no parameters to these
  if model in moe_variants.PKM_SUBKEYS:
    variants += ["pkm_relu"]
  for variant in variants:
    params = model_report(moe_variants.get_config(f"{model},{variant}").model)["total_params"]
    assert abs(params - dense) < 0.01 * dense, variant  # "parameter matched"
  if model in moe_variants.PKM_SUBKEYS:
    values_matched = moe_variants.get_config(f"{model},pkm_values_relu").model
    assert model_report(values_matched)["total_params"] < 0.97 * dense
