"""Fine-tuning methods select what trains by parameter type: plug-ins, the head, LayerNorms."""

import jax
import pytest
from flax import nnx

from sparse_jax.finetune import methods
from sparse_jax.finetune.storage import abstract_classifier
from sparse_jax.layers.adapters import BottleneckAdapter
from sparse_jax.layers.param_types import HeadParam, LayerNormParam, PlugInParam
from sparse_jax.layers.spartan import SpartanMemory
from sparse_jax.models.encoder import roberta_base_config


def tiny_classifier(kind: str):
  cfg = roberta_base_config()
  cfg.update(vocab_size=40, d_model=16, n_layers=2, n_heads=2, max_positions=20)
  cfg.ff.d_ff = 32
  method = methods.default_method_config(kind)
  method.spartan.update(n_parents=4, n_children=2, top_k=2)
  method.adapter.bottleneck = 4
  return abstract_classifier(cfg, method, num_classes=3), method


def modules_of_type(model, module_type):
  return [node for _, node in nnx.iter_graph(model) if isinstance(node, module_type)]


def test_layers_create_their_parameters_with_their_role():
  memory = SpartanMemory(8, n_parents=4, n_children=2, top_k=2, rngs=nnx.Rngs(0))
  adapter = BottleneckAdapter(8, 4, rngs=nnx.Rngs(0))
  for module in (memory, adapter):
    params = jax.tree.leaves(nnx.state(module, nnx.Param),
                             is_leaf=lambda x: isinstance(x, nnx.Variable))
    assert params and all(isinstance(p, PlugInParam) for p in params)
  model, _ = tiny_classifier("spartan")
  assert all(isinstance(norm.scale, LayerNormParam) and isinstance(norm.bias, LayerNormParam)
             for norm in modules_of_type(model, nnx.LayerNorm))
  head = nnx.state(model.head, nnx.Param)
  assert all(isinstance(p, HeadParam) for p in jax.tree.leaves(
      head, is_leaf=lambda x: isinstance(x, nnx.Variable)))


@pytest.mark.parametrize("kind", methods.METHODS)
def test_trainable_parameters_are_exactly_the_methods_roles(kind):
  model, method = tiny_classifier(kind)
  trainable = nnx.state(model, methods.trainable_filter(method))
  paths = {jax.tree_util.keystr(path) for path, _ in jax.tree_util.tree_leaves_with_path(
      trainable)}
  all_params = {jax.tree_util.keystr(path) for path, _ in jax.tree_util.tree_leaves_with_path(
      nnx.state(model, nnx.Param))}
  plug_ins = [p for p in paths if "memory" in p or "adapter" in p]
  norms = [p for p in paths if "norm" in p]
  heads = [p for p in paths if p.startswith("['head']")]
  if kind == "full":
    assert paths == all_params
    return
  assert heads and len(paths) == len(plug_ins) + len(norms) + len(heads)
  assert bool(plug_ins) == (kind in methods.PLUG_IN_METHODS)
  assert bool(norms) == methods.parse(method).trains_layer_norms
  n_norm_params = sum(2 for _ in modules_of_type(model, nnx.LayerNorm))
  assert len(norms) in (0, n_norm_params)
