"""Per-layer plug-ins for parameter-efficient fine-tuning, built from the `model` config.

- `model.memory`: `{"kind": "none"}` or `{"kind": "spartan", "n_parents", "n_children",
  "top_k", "temperature"}`: a SPARTAN memory after every layer (paper Sec. 3).
- `model.adapters`: `{"kind": "none"}` or `{"kind": "houlsby" | "pfeiffer", "bottleneck",
  "activation"}`: bottleneck adapters (Houlsby: after attention and after FF; Pfeiffer: after
  FF only; encoder layers only).

Missing sections mean "none", so every existing config keeps its model unchanged.
"""

import ml_collections
from flax import nnx

from sparse_jax import validation
from sparse_jax.layers.adapters import ADAPTERS_PER_LAYER, BottleneckAdapter
from sparse_jax.layers.dense_ff import ACTIVATIONS
from sparse_jax.layers import spartan

MEMORY_KINDS = ("none", "spartan")
ADAPTER_KINDS = ("none", *ADAPTERS_PER_LAYER)


def memory_kind(cfg: ml_collections.ConfigDict) -> str:
  return (cfg.get("memory") or {}).get("kind", "none")


def adapter_kind(cfg: ml_collections.ConfigDict) -> str:
  return (cfg.get("adapters") or {}).get("kind", "none")


def build_memory(cfg: ml_collections.ConfigDict,
                 rngs: nnx.Rngs) -> spartan.SpartanMemory | None:
  """The memory of `cfg.memory` for one layer of width `cfg.d_model`, or None."""
  kind = memory_kind(cfg)
  validation.require_choice(kind, "model.memory.kind", MEMORY_KINDS)
  if kind == "none":
    return None
  memory = cfg.memory
  fields = {name: memory.get(name) for name in ("n_parents", "n_children", "top_k")}
  for name, value in fields.items():
    validation.require_positive_int(value, f"model.memory.{name}")
  validation.require(fields["top_k"] <= fields["n_parents"], "model.memory.top_k",
                     f"at most model.memory.n_parents={fields['n_parents']}", fields["top_k"])
  temperature = memory.get("temperature", 1.0)
  validation.require(isinstance(temperature, (int, float)) and temperature > 0,
                     "model.memory.temperature", "a positive number", temperature)
  read = memory.get("read", "auto")
  validation.require_choice(read, "model.memory.read", ("auto", *spartan.READS))
  return spartan.SpartanMemory(cfg.d_model, **fields, temperature=temperature, read=read,
                               rngs=rngs)


def apply_memory(memory: spartan.SpartanMemory | None, h_btd, aux: dict):
  """`(h, aux)` after the layer's memory slot: unchanged without a memory, else the memory's
  output and its diagnostics added to the layer's `aux` as `memory/<key>`."""
  if memory is None:
    return h_btd, aux
  h_btd, memory_aux = memory(h_btd)
  return h_btd, {**aux, **{f"memory/{k}": v for k, v in memory_aux.items() if k != "reg_loss"}}


def build_adapter(cfg: ml_collections.ConfigDict, position: str,
                  rngs: nnx.Rngs) -> BottleneckAdapter | None:
  """The adapter of `cfg.adapters` at `position` ("attn" or "ff") of one layer, or None."""
  kind = adapter_kind(cfg)
  validation.require_choice(kind, "model.adapters.kind", ADAPTER_KINDS)
  if kind == "none" or (kind == "pfeiffer" and position == "attn"):
    return None
  bottleneck = cfg.adapters.get("bottleneck")
  validation.require_positive_int(bottleneck, "model.adapters.bottleneck")
  activation = cfg.adapters.get("activation", "relu")
  validation.require_choice(activation, "model.adapters.activation", ACTIVATIONS)
  return BottleneckAdapter(cfg.d_model, bottleneck, activation=activation, rngs=rngs)
