"""Per-layer plug-ins for parameter-efficient fine-tuning: the `model.memory` and
`model.adapters` sections and what they build.

- `model.memory`: `{"kind": "none"}` or `{"kind": "spartan", "n_parents", "n_children",
  "top_k", "temperature", "read"}`: a SPARTAN memory after every layer (paper Sec. 3).
- `model.adapters`: `{"kind": "none"}` or `{"kind": "houlsby" | "pfeiffer", "bottleneck",
  "activation", "original_ln_before", "init"}`: bottleneck adapters (Houlsby: after attention
  and after FF; Pfeiffer: after FF only), AdapterHub's by default
  (`sparse_jax.layers.adapters`).

A missing section means "none", so every existing config keeps its model unchanged.
"""

from typing import Literal

from flax import nnx

from sparse_jax import schema, validation
from sparse_jax.layers import spartan
from sparse_jax.layers.adapters import (ADAPTER_INITS, ADAPTERHUB_DEFAULTS, ADAPTERS_PER_LAYER,
                                        BottleneckAdapter)
from sparse_jax.layers.dense_ff import ACTIVATIONS


class MemoryConfig(schema.Schema, tag="kind", default="none"):
  """The `model.memory` section: `kind` picks the schema of the other fields."""

  kind: str  # "none", or "spartan": a memory after every layer.


@MemoryConfig.variant("none")
class NoMemoryConfig(MemoryConfig):
  """No memory slot."""


@MemoryConfig.variant("spartan")
class SpartanMemoryConfig(MemoryConfig):
  """A SPARTAN memory (`layers.spartan.SpartanMemory`) after every layer."""

  n_parents: schema.PositiveInt  # Parent cells of each memory (N_p).
  n_children: schema.PositiveInt  # Child cells of each parent (N_c).
  top_k: schema.PositiveInt  # Parents each token reads (K).
  temperature: schema.PositiveFloat = 1.0  # Of the softmax over a parent's children.
  # How the chosen parents' children are read: "gather" them, or "dense" (every child).
  read: Literal[("auto", *spartan.READS)] = "auto"

  def check(self, path: str) -> None:
    validation.require(self.top_k <= self.n_parents, f"{path}.top_k",
                       f"at most {path}.n_parents={self.n_parents}", self.top_k)


class AdapterConfig(schema.Schema, tag="kind", default="none"):
  """The `model.adapters` section: `kind` picks the schema of the other fields."""

  kind: str  # "none", or the bottleneck adapters of "houlsby" or "pfeiffer".


@AdapterConfig.variant("none")
class NoAdapterConfig(AdapterConfig):
  """No adapters."""


@AdapterConfig.variant(*ADAPTERS_PER_LAYER)
class BottleneckAdapterConfig(AdapterConfig):
  """Bottleneck adapters (`layers.adapters.BottleneckAdapter`), Houlsby's or Pfeiffer's;
  `activation` and `original_ln_before` None take the kind's AdapterHub setting."""

  bottleneck: schema.PositiveInt  # Hidden units of each adapter.
  activation: Literal[tuple(ACTIVATIONS)] | None = None  # Of the hidden units.
  # What the adapter reads (`layers.adapters`): True the sum after the original LayerNorm
  # (Pfeiffer), False the sublayer's output (Houlsby); None: the kind's.
  original_ln_before: bool | None = None
  init: Literal[ADAPTER_INITS] = "bert"  # N(0, 0.02) weights, or Houlsby's near-identity.

  def setting(self, name: str):
    """The field `name`, or the kind's AdapterHub default when it is None."""
    value = getattr(self, name)
    return ADAPTERHUB_DEFAULTS[self.kind][name] if value is None else value


def build_memory(memory: MemoryConfig, d_model: int,
                 rngs: nnx.Rngs) -> spartan.SpartanMemory | None:
  """The memory of `memory` for one layer of width `d_model`, or None."""
  if not isinstance(memory, SpartanMemoryConfig):
    return None
  return spartan.SpartanMemory(d_model, memory.n_parents, memory.n_children, memory.top_k,
                               temperature=memory.temperature, read=memory.read, rngs=rngs)


def apply_memory(memory: spartan.SpartanMemory | None, h_btd, aux: dict):
  """`(h, aux)` after the layer's memory slot: unchanged without a memory, else the memory's
  output and its diagnostics added to the layer's `aux` as `memory/<key>`."""
  if memory is None:
    return h_btd, aux
  h_btd, memory_aux = memory(h_btd)
  return h_btd, {**aux, **{f"memory/{k}": v for k, v in memory_aux.items() if k != "reg_loss"}}


def build_adapter(adapters: AdapterConfig, d_model: int, position: str,
                  rngs: nnx.Rngs) -> BottleneckAdapter | None:
  """The adapter of `adapters` at `position` ("attn" or "ff") of one layer, or None
  (Pfeiffer's have none after the attention)."""
  if not isinstance(adapters, BottleneckAdapterConfig) or (
      adapters.kind == "pfeiffer" and position == "attn"):
    return None
  return BottleneckAdapter(d_model, adapters.bottleneck,
                           activation=adapters.setting("activation"),
                           original_ln_before=adapters.setting("original_ln_before"),
                           init=adapters.init, rngs=rngs)
