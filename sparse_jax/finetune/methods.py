"""Fine-tuning methods, all in one place: their kinds and defaults, the plug-ins they insert
into a backbone and the filter of the parameters that train.

`method.kind`:
- `spartan`: a SPARTAN memory after every layer (SPARTAN Sec. 3); memory and head train.
- `houlsby` / `pfeiffer`: bottleneck adapters (SPARTAN Sec. 4); adapters and head train.
- `full`: no plug-in; every parameter trains (the RoBERTa baseline).
- `head`: no plug-in; only the head trains (a linear-probe-style floor).
With `method.train_layer_norms` the backbone's LayerNorms train too, as in the SPARTAN
reference code (the paper does not say so). Everything else is frozen: the optimiser holds state
for the trainable parameters only and gradients are taken with respect to them only, so frozen
parameters stay bit-identical and a task's checkpoint needs only the trainable part.
"""

import copy

import ml_collections
from flax import nnx

from sparse_jax import validation

METHODS = ("full", "head", "houlsby", "pfeiffer", "spartan")
_PLUGIN_PATHS = {"spartan": ("memory",), "houlsby": ("attn_adapter", "ff_adapter"),
                 "pfeiffer": ("ff_adapter",), "head": (), "full": ()}


def default_method_config(kind: str) -> ml_collections.ConfigDict:
  """The `method` section with the paper's settings (App. A): N_p 16, N_c 3, top-K 8;
  bottleneck 64; the reference's trainable LayerNorms."""
  return ml_collections.ConfigDict({
      "kind": kind, "train_layer_norms": kind != "head", "head_dropout": 0.1,
      "spartan": {"n_parents": 16, "n_children": 3, "top_k": 8, "temperature": 1.0,
                  "read": "auto"},
      "adapter": {"bottleneck": 64, "activation": "relu"},
  })


def validate_method_config(method: ml_collections.ConfigDict) -> None:
  validation.require_choice(method.get("kind"), "method.kind", METHODS)
  validation.require(isinstance(method.get("train_layer_norms", False), bool),
                     "method.train_layer_norms", "True or False",
                     method.get("train_layer_norms"))


def with_method(model_cfg: ml_collections.ConfigDict,
                method: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """A copy of the backbone's `model` section with the plug-ins of `method.kind` set."""
  validate_method_config(method)
  cfg = copy.deepcopy(model_cfg)
  with cfg.unlocked():
    cfg.memory = ({"kind": "spartan", **method.spartan.to_dict()} if method.kind == "spartan"
                  else {"kind": "none"})
    cfg.adapters = ({"kind": method.kind, **method.adapter.to_dict()}
                    if method.kind in ("houlsby", "pfeiffer") else {"kind": "none"})
  return cfg


def is_layer_norm(path, _) -> bool:
  """An NNX filter: a LayerNorm's parameters (a path part ending in "norm")."""
  return any(isinstance(part, str) and part.endswith("norm") for part in path)


def trainable_filter(method: ml_collections.ConfigDict):
  """The NNX filter of the parameters that `method` trains (module docstring)."""
  validate_method_config(method)
  if method.kind == "full":
    return nnx.Param
  parts = [nnx.PathContains("head"), *map(nnx.PathContains, _PLUGIN_PATHS[method.kind])]
  if method.get("train_layer_norms", False):
    parts.append(is_layer_norm)
  return nnx.All(nnx.Param, nnx.Any(*parts))
