"""The fine-tuning configs default to what the SPARTAN reference ran (REFERENCE.md 3b): child
temperature 1.6, the Hugging Face Trainer's schedule, AdapterHub's adapters and freezing, and
both few-shot settings."""

import jax
import numpy as np
import pytest
from flax import nnx

from sparse_jax.configs import finetune_common, glue, spartan_stdlib
from sparse_jax.finetune import methods
from sparse_jax.layers.adapters import BottleneckAdapter
from sparse_jax.models.encoder import Encoder, roberta_base_config
from sparse_jax.tasks import validate_config
from sparse_jax.training.optimizer import TrainConfig, learning_rate_schedule


def hf_linear_schedule(step, lr, steps, warmup):
  """`transformers.get_linear_schedule_with_warmup`'s multiplier times lr, as documented."""
  if step < warmup:
    return lr * step / max(1, warmup)
  return lr * max(0.0, (steps - step) / max(1, steps - warmup))


@pytest.mark.parametrize("warmup", [0, 7])
def test_linear_schedule_is_the_hugging_face_trainers(warmup):
  cfg = TrainConfig.parse(dict(steps=50, lr=1e-3, warmup_steps=warmup, schedule="linear",
                               log_every=1, eval_every=1, ckpt_every=1), "train")
  schedule = learning_rate_schedule(cfg)
  for step in range(51):
    assert float(schedule(step)) == pytest.approx(hf_linear_schedule(step, 1e-3, 50, warmup),
                                                  rel=1e-5, abs=1e-9)


def test_glue_and_stdlib_configs_default_to_the_reference_run():
  for config in (glue.get_config("rte"), spartan_stdlib.get_config()):
    typed = validate_config(config)
    assert typed.method.spartan.temperature == 1.6
    assert (typed.train.schedule, typed.train.warmup_steps, typed.train.lr) == ("linear", 0,
                                                                               1e-3)
  houlsby = validate_config(glue.get_config("rte,houlsby")).method
  pfeiffer = validate_config(glue.get_config("rte,pfeiffer")).method
  assert (houlsby.adapter.activation, houlsby.adapter.original_ln_before) == ("swish", False)
  assert (pfeiffer.adapter.activation, pfeiffer.adapter.original_ln_before) == ("relu", True)
  assert houlsby.adapter.init == pfeiffer.adapter.init == "bert"
  trains_norms = {kind: validate_config(glue.get_config(f"rte,{kind}")).method.trains_layer_norms
                  for kind in methods.METHODS}
  assert trains_norms == {"spartan": True, "full": True, "houlsby": False, "pfeiffer": False,
                          "head": False}


def test_few_shot_settings_of_the_paper_and_of_the_reference_script():
  paper = validate_config(glue.get_config("rte,pfeiffer,fewshot"))
  assert (paper.task.n_train, paper.task.n_train_from, paper.train.steps) == (200, "random",
                                                                             1000)
  script = validate_config(glue.get_config("rte,fewshot_script"))
  # The first 200 examples for 3 epochs at batch 16: ceil(600 / 16) steps.
  assert (script.task.n_train, script.task.n_train_from, script.train.steps) == (200, "first",
                                                                               38)
  assert script.method.kind == "spartan"
  for bad in ("fewshot,fewshot_script", "spartan,houlsby", "lora"):
    with pytest.raises(ValueError, match="fewshot_script"):
      finetune_common.parse(bad)


@pytest.mark.parametrize("kind", ["houlsby", "pfeiffer"])
def test_encoder_layers_take_each_kinds_adapterhub_settings(kind):
  cfg = roberta_base_config()
  cfg.update(vocab_size=40, d_model=16, n_layers=2, n_heads=2, max_positions=20)
  cfg.ff.d_ff = 32
  cfg.adapters = methods.parse(methods.default_method_config(kind)).adapters_section()
  encoder = Encoder(cfg, rngs=nnx.Rngs(0))
  adapters = [node for _, node in nnx.iter_graph(encoder) if isinstance(node, BottleneckAdapter)]
  assert len(adapters) == 2 * (2 if kind == "houlsby" else 1)
  assert {(a.activation, a.original_ln_before, a.bottleneck) for a in adapters} == {
      ("swish", False, 64) if kind == "houlsby" else ("relu", True, 64)}


def test_pfeiffer_in_an_encoder_layer_reads_the_normalised_sum():
  """LN(h + x + A(LN(h + x))) with the layer's own pretrained FF LayerNorm, checked in float64
  numpy against the layer's submodules (the attention, FF and LayerNorms are tested alone)."""
  cfg = roberta_base_config()
  cfg.update(vocab_size=40, d_model=8, n_layers=1, n_heads=2, max_positions=20, dropout=0.0)
  cfg.ff.d_ff = 16
  cfg.adapters = {"kind": "pfeiffer", "bottleneck": 4}
  layer = Encoder(cfg, rngs=nnx.Rngs(3)).layers[0]
  layer.eval()
  x = jax.random.normal(jax.random.key(0), (2, 5, 8))
  valid = np.ones((2, 5), bool)
  h_attn = layer.attn_norm(x + layer.attn(x, valid))
  f = np.asarray(layer.ff(h_attn)[0], np.float64)
  h = np.asarray(h_attn, np.float64)
  scale, bias = (np.asarray(p[...], np.float64) for p in (layer.ff_norm.scale, layer.ff_norm.bias))

  def norm(y):
    return (y - y.mean(-1, keepdims=True)) / np.sqrt(y.var(-1, keepdims=True) + 1e-5) * scale + bias

  a, rng = layer.ff_adapter, np.random.default_rng(1)
  for name in ("w_down", "b_down", "w_up", "b_up"):  # O(1) weights: the input form matters
    getattr(a, name)[...] = rng.normal(size=getattr(a, name).shape).astype(np.float32)
  w = {n: np.asarray(getattr(a, n)[...], np.float64) for n in ("w_down", "b_down", "w_up", "b_up")}
  z = norm(h + f)
  bottleneck = np.maximum(z @ w["w_down"] + w["b_down"], 0) @ w["w_up"] + w["b_up"]
  want = norm(h + f + bottleneck)
  got, _ = layer(x, valid)
  np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
