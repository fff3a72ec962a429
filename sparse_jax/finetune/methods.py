"""Fine-tuning methods, all in one place: their kinds and defaults, the plug-ins they insert
into a backbone and the filter of the parameters that train.

`method.kind`:
- `spartan`: a SPARTAN memory after every layer (SPARTAN Sec. 3); memory, head and the
  backbone's LayerNorms train, as in the SPARTAN reference code (the paper does not say so).
- `houlsby` / `pfeiffer`: bottleneck adapters as AdapterHub builds them (SPARTAN Sec. 4);
  adapters and head train (AdapterHub's `train_adapter` freezes the LayerNorms).
- `full`: no plug-in; every parameter trains (the RoBERTa baseline).
- `head`: no plug-in; only the head trains (a linear-probe-style floor).
`method.train_layer_norms` overrides whether the backbone's LayerNorms train. Everything else
is frozen: the optimiser holds state
for the trainable parameters only and gradients are taken with respect to them only, so frozen
parameters stay bit-identical and a task's checkpoint needs only the trainable part.

What trains is selected by parameter type (`sparse_jax.layers.param_types`: plug-ins, head,
LayerNorms), never by attribute names.
"""

import copy
from typing import Literal

import ml_collections
from flax import nnx

from sparse_jax import schema
from sparse_jax.layers.adapters import ADAPTER_INITS, ADAPTERHUB_DEFAULTS, ADAPTERS_PER_LAYER
from sparse_jax.layers.dense_ff import ACTIVATIONS
from sparse_jax.layers.param_types import HeadParam, LayerNormParam, PlugInParam
from sparse_jax.layers.spartan import READS, REFERENCE_TEMPERATURE
from sparse_jax.models import plugins

METHODS = ("full", "head", "houlsby", "pfeiffer", "spartan")
# The methods that insert plug-ins into the backbone, and the learning rate of each method
# (SPARTAN App. A: SPARTAN 1e-3, adapters 1e-4, full fine-tuning 2e-5).
PLUG_IN_METHODS = ("houlsby", "pfeiffer", "spartan")
LEARNING_RATES = {"spartan": 1e-3, "houlsby": 1e-4, "pfeiffer": 1e-4, "full": 2e-5, "head": 1e-3}


class SpartanSettings(schema.Schema):
  """`method.spartan`: the memory of every layer (SPARTAN App. A: N_p 16, N_c 3, top-K 8)."""

  n_parents: schema.PositiveInt = 16  # Parent cells of each memory (N_p).
  n_children: schema.PositiveInt = 3  # Child cells of each parent (N_c).
  top_k: schema.PositiveInt = 8  # Parents each token reads (K).
  # The reference code's child temperature (every run); the paper's Eq. 2 has none (1.0).
  temperature: schema.PositiveFloat = REFERENCE_TEMPERATURE
  # How the chosen parents' children are read: "gather" them, or "dense" (every child).
  read: Literal[("auto", *READS)] = "auto"


class AdapterSettings(schema.Schema):
  """`method.adapter`: the bottleneck adapters (SPARTAN App. A: bottleneck 64), AdapterHub's
  (`layers.adapters`); `activation` and `original_ln_before` None take the kind's AdapterHub
  setting (`ADAPTERHUB_DEFAULTS`)."""

  bottleneck: schema.PositiveInt = 64  # Hidden units of each adapter.
  activation: Literal[tuple(ACTIVATIONS)] | None = None  # Of the hidden units.
  # What the adapter reads (`layers.adapters`): True the sum after the original LayerNorm
  # (Pfeiffer), False the sublayer's output (Houlsby); None: the kind's.
  original_ln_before: bool | None = None
  init: Literal[ADAPTER_INITS] = "bert"  # N(0, 0.02) weights, or Houlsby's near-identity.


class MethodConfig(schema.Schema):
  """The `method` section. `train_layer_norms` None follows the reference code of each method:
  SPARTAN's trains the backbone's LayerNorms (the paper does not say so), AdapterHub's
  `train_adapter` freezes them, `full` trains everything and `head` only the head."""

  kind: Literal[METHODS]  # What is trained: the head, everything, or plug-ins and the head.
  train_layer_norms: bool | None = None  # Also train the backbone's LayerNorms.
  head_dropout: schema.Probability = 0.1  # Dropout before the classification head.
  spartan: SpartanSettings
  adapter: AdapterSettings

  @property
  def trains_layer_norms(self) -> bool:
    if self.train_layer_norms is None:
      return self.kind in ("spartan", "full")
    return self.train_layer_norms

  def memory_section(self) -> dict:
    """The backbone's `model.memory` section this method sets."""
    return ({"kind": "spartan", **self.spartan.to_dict()} if self.kind == "spartan"
            else {"kind": "none"})

  def adapters_section(self) -> dict:
    """The backbone's `model.adapters` section this method sets."""
    return ({"kind": self.kind, **self.adapter.to_dict()}
            if self.kind in ADAPTERS_PER_LAYER else {"kind": "none"})

  def check(self, path: str) -> None:
    plugins.MemoryConfig.parse(self.memory_section(), f"{path}.spartan")


def parse(method) -> MethodConfig:
  """The typed `method` section (a ConfigDict, dict or `MethodConfig`)."""
  return MethodConfig.parse(method, "method")


def default_method_config(kind: str) -> ml_collections.ConfigDict:
  """The `method` section of `kind` with every default written out (for config files: a
  field's type comes from its value, so none is None)."""
  method = parse({"kind": kind})
  section = ml_collections.ConfigDict({**method.to_dict(),
                                       "train_layer_norms": method.trains_layer_norms})
  adapterhub = ADAPTERHUB_DEFAULTS.get(kind, ADAPTERHUB_DEFAULTS["pfeiffer"])
  section.adapter.update({name: value for name, value in adapterhub.items()
                          if section.adapter[name] is None})
  return section


def with_method(model_cfg, method) -> ml_collections.ConfigDict:
  """A copy of the backbone's `model` section (a ConfigDict or typed) with the plug-ins of
  `method` set."""
  method = parse(method)
  cfg = ml_collections.ConfigDict(copy.deepcopy(model_cfg.to_dict()))
  cfg.memory = method.memory_section()
  cfg.adapters = method.adapters_section()
  return cfg


def trainable_filter(method):
  """The NNX filter of the parameters that `method` trains (module docstring)."""
  method = parse(method)
  if method.kind == "full":
    return nnx.Param
  parts = [nnx.OfType(HeadParam)]
  if method.kind in PLUG_IN_METHODS:
    parts.append(nnx.OfType(PlugInParam))
  if method.trains_layer_norms:
    parts.append(nnx.OfType(LayerNormParam))
  return nnx.Any(*parts)
