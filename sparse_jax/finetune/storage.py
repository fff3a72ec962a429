"""What storing fine-tuned models for T tasks costs, per method (SPARTAN App. E, Table 1).

A parameter-efficient (PE) method keeps one frozen backbone and stores per task only what
trained: its plug-ins (SPARTAN memories or adapters), the task head and, with
`method.train_layer_norms`, its copy of the backbone's LayerNorms. Full fine-tuning stores a
whole model per task. The counts come from the classifier actually built for the method
(`nnx.eval_shape`: shapes only, nothing allocated, so RoBERTa-base costs nothing), with the
trainable part selected by `methods.trainable_filter`, the same filter training uses.

App. E's SPARTAN formula is `N_backbone + 2 T (P + P C) d L`: it counts `2 (P + P C) d`
parameters per layer, while Sec. 3's memory has `(P + 2 P C) d` (parents `P x d`, child keys
and child values `P C x d` each; `spartan_params`). We count the actual parameters and report
the formula's number next to ours (`app_e_params`). App. E gives no formula for the other
rows; its totals (1107M for RoBERTa, 144.23M for Houlsby, 133.62M for Pfeiffer, 9 tasks)
fit `T N`, `N + T 4 d b L` and `N + T 2 d b L` (weights only: no biases, heads or
LayerNorms), which `app_e_params` uses for them. App. E's GB are decimal (10^9 bytes) at
4 bytes per parameter.
"""

import jax
import ml_collections
from flax import nnx

from sparse_jax.finetune import methods
from sparse_jax.layers.adapters import ADAPTERS_PER_LAYER
from sparse_jax.layers.param_types import LayerNormParam, PlugInParam
from sparse_jax.models.classifier import SequenceClassifier


def abstract_classifier(model_cfg: ml_collections.ConfigDict,
                        method_cfg: ml_collections.ConfigDict,
                        num_classes: int) -> SequenceClassifier:
  """The classifier `method_cfg` fine-tunes, as shapes only (`nnx.eval_shape`)."""
  method = methods.parse(method_cfg)
  cfg = methods.with_method(model_cfg, method)
  return nnx.eval_shape(lambda: SequenceClassifier(
      cfg, num_classes, head_dropout=method.head_dropout, rngs=nnx.Rngs(0)))


def _size(module: nnx.Module, variable_filter) -> int:
  return sum(leaf.size for leaf in jax.tree.leaves(nnx.state(module, variable_filter)))


def app_e_params(model_cfg: ml_collections.ConfigDict, method_cfg: ml_collections.ConfigDict,
                 backbone_params: int, n_tasks: int) -> int | None:
  """App. E's storage in parameters for `n_tasks` tasks (module docstring); None for `head`."""
  d, n_layers, kind = model_cfg.d_model, model_cfg.n_layers, method_cfg.kind
  if kind == "spartan":
    p, c = method_cfg.spartan.n_parents, method_cfg.spartan.n_children
    return backbone_params + 2 * n_tasks * (p + p * c) * d * n_layers
  if kind in ADAPTERS_PER_LAYER:
    b = method_cfg.adapter.bottleneck
    return backbone_params + n_tasks * ADAPTERS_PER_LAYER[kind] * 2 * d * b * n_layers
  return n_tasks * backbone_params if kind == "full" else None


def storage_report(model_cfg: ml_collections.ConfigDict, method_cfg: ml_collections.ConfigDict,
                   num_classes: int = 2, n_tasks: int = 9, bytes_per_param: int = 4) -> dict:
  """Parameter counts and storage of `method_cfg` on the backbone `model_cfg`.

  Returns a dict of plain numbers: `model_params` (one task's whole classifier),
  `backbone_params` (the pretrained part, plug-ins and head excluded), `added_params`
  (plug-ins), `head_params`, `layer_norm_params` (the backbone's), `trainable_params` (what
  one task's checkpoint stores), `bytes_per_task`, `storage_params` / `storage_bytes` for
  `n_tasks` tasks (PE: backbone once plus `n_tasks` checkpoints; `full`: `n_tasks` whole
  models), `storage_x_backbone` (Table 1's storage column), and `app_e_params` /
  `app_e_bytes` (App. E's formula, see the module docstring).
  """
  model = abstract_classifier(model_cfg, method_cfg, num_classes)
  model_params = _size(model, nnx.Param)
  added = _size(model, PlugInParam)
  head = _size(model.head, nnx.Param)
  backbone = model_params - added - head
  trainable = _size(model, methods.trainable_filter(method_cfg))
  full = method_cfg.kind == "full"
  storage = n_tasks * model_params if full else backbone + n_tasks * trainable
  app_e = app_e_params(model_cfg, method_cfg, backbone, n_tasks)
  return {
      "method": method_cfg.kind, "num_classes": num_classes, "n_tasks": n_tasks,
      "bytes_per_param": bytes_per_param, "model_params": model_params,
      "backbone_params": backbone, "added_params": added, "head_params": head,
      "layer_norm_params": _size(model, LayerNormParam),
      "trainable_params": trainable, "trainable_fraction": trainable / model_params,
      "bytes_per_task": trainable * bytes_per_param,
      "storage_params": storage, "storage_bytes": storage * bytes_per_param,
      "storage_x_backbone": storage / backbone,
      "app_e_params": app_e, "app_e_bytes": None if app_e is None else app_e * bytes_per_param,
  }
