"""The feed-forward registry: `model.ff.kind` -> constructor.

Every feed-forward replacement (dense, top-k, PKM, the MoEs, ...) is built through here, so a
model picks its FF layer by config alone. Adding a kind means one layer file and one
`@register_ff` builder; the builder validates its own fields and names them in errors.
"""

from typing import Callable

import ml_collections
from flax import nnx

import pallas_kernels
from sparse_jax import validation
from sparse_jax.layers import moe, pkm
from sparse_jax.layers.dense_ff import ACTIVATIONS, DenseFF
from sparse_jax.layers.routers import NoisyTopKRouter, SBaseRouter, SoftmaxRouter, SwitchRouter
from sparse_jax.layers.sparse_ff import SparseFF
from sparse_jax.layers.topk_ff import TopKFF

FFBuilder = Callable[..., nnx.Module]
_FF_BUILDERS: dict[str, FFBuilder] = {}


def register_ff(kind: str) -> Callable[[FFBuilder], FFBuilder]:
  """Registers `builder(ff_config, *, d_model, n_layers, rngs) -> module` under `kind`."""

  def decorate(builder: FFBuilder) -> FFBuilder:
    if kind in _FF_BUILDERS:
      raise ValueError(f"feed-forward kind {kind!r} is registered twice.")
    _FF_BUILDERS[kind] = builder
    return builder

  return decorate


def ff_kinds() -> list[str]:
  return sorted(_FF_BUILDERS)


def build_ff(ff: ml_collections.ConfigDict, *, d_model: int, n_layers: int,
             rngs: nnx.Rngs) -> nnx.Module:
  """Builds the FF layer that `ff.kind` names, from the other fields of `ff`."""
  validation.require_choice(ff.get("kind"), "model.ff.kind", _FF_BUILDERS)
  return _FF_BUILDERS[ff.kind](ff, d_model=d_model, n_layers=n_layers, rngs=rngs)


def _dropout_field(ff, name: str) -> float:
  value = ff.get(name, 0.0)
  validation.require_probability(value, f"model.ff.{name}")
  return value


@register_ff("dense")
def _build_dense(ff, *, d_model, n_layers, rngs):
  validation.require_positive_int(ff.get("d_ff"), "model.ff.d_ff")
  activation = ff.get("activation", "relu")
  validation.require_choice(activation, "model.ff.activation", ACTIVATIONS)
  return DenseFF(d_model, ff.d_ff, n_layers=n_layers, dropout=_dropout_field(ff, "dropout"),
                 activation=activation, rngs=rngs)


@register_ff("topk")
def _build_topk(ff, *, d_model, n_layers, rngs):
  validation.require_positive_int(ff.get("d_ff"), "model.ff.d_ff")
  k = ff.get("k")
  validation.require(isinstance(k, int) and 0 < k <= ff.d_ff, "model.ff.k",
                     f"an integer in [1, model.ff.d_ff={ff.d_ff}]", k)
  return TopKFF(d_model, ff.d_ff, k, n_layers=n_layers, dropout=_dropout_field(ff, "dropout"),
                rngs=rngs)


@register_ff("pkm")
def _build_pkm(ff, *, d_model, n_layers, rngs):
  validation.require(d_model % 2 == 0, "model.d_model", "even for a PKM", d_model)
  validation.require_positive_int(ff.get("n_subkeys"), "model.ff.n_subkeys")
  knn = ff.get("knn")
  validation.require(isinstance(knn, int) and 0 < knn <= ff.n_subkeys ** 2, "model.ff.knn",
                     f"an integer in [1, model.ff.n_subkeys^2={ff.n_subkeys ** 2}]", knn)
  n_heads = ff.get("n_heads", 4)
  validation.require_positive_int(n_heads, "model.ff.n_heads")
  activation, init = ff.get("activation", "relu"), ff.get("init", "lample")
  validation.require_choice(activation, "model.ff.activation", pkm.ACTIVATIONS)
  validation.require_choice(init, "model.ff.init", pkm.INITS)
  return pkm.PKM(d_model, ff.n_subkeys, knn, n_layers=n_layers, n_heads=n_heads,
                 activation=activation, init=init, rngs=rngs)


def _moe_fields(ff, *, top_k: bool = True) -> dict:
  """Checks the fields all MoE kinds share; returns `n_experts`, `k` (if any), ..."""
  validation.require_positive_int(ff.get("n_experts"), "model.ff.n_experts")
  validation.require_positive_int(ff.get("expert_size"), "model.ff.expert_size")
  fields = {}
  if top_k:
    k = ff.get("k")
    validation.require(isinstance(k, int) and 0 < k <= ff.n_experts, "model.ff.k",
                       f"an integer in [1, model.ff.n_experts={ff.n_experts}]", k)
    fields["k"] = k
  reg_coef = ff.get("reg_coef")
  validation.require(isinstance(reg_coef, (int, float)) and reg_coef >= 0, "model.ff.reg_coef",
                     "a number >= 0", reg_coef)
  fields["reg_coef"] = float(reg_coef)
  return fields


def _expert_fields(ff, default_init: str) -> dict:
  """The expert computation's options, shared by every MoE kind."""
  init, impl = ff.get("init", default_init), ff.get("impl", "auto")
  validation.require_choice(init, "model.ff.init", moe.EXPERT_INITS)
  validation.require_choice(impl, "model.ff.impl", pallas_kernels.IMPLS)
  return {"init": init, "impl": impl,
          "expert_hidden_dropout": _dropout_field(ff, "expert_hidden_dropout")}


@register_ff("sigma_moe")
def _build_sigma_moe(ff, *, d_model, n_layers, rngs):
  fields = _moe_fields(ff)
  return moe.SigmaMoE(d_model, ff.n_experts, ff.expert_size, fields["k"], n_layers=n_layers,
                      expert_dropout=_dropout_field(ff, "expert_dropout"),
                      reg_coef=fields["reg_coef"], **_expert_fields(ff, "sigma"), rngs=rngs)


def _routed_moe(ff, router, *, d_model, n_layers, default_init, rngs):
  return moe.MoE(d_model, ff.n_experts, ff.expert_size, router, n_layers=n_layers,
                 **_expert_fields(ff, default_init), rngs=rngs)


@register_ff("switch")
def _build_switch(ff, *, d_model, n_layers, rngs):
  fields = _moe_fields(ff, top_k=False)
  mu = ff.get("capacity_factor")
  validation.require(isinstance(mu, (int, float)) and mu > 0, "model.ff.capacity_factor",
                     "a positive number", mu)
  router = SwitchRouter(d_model, ff.n_experts, n_layers=n_layers, capacity_factor=float(mu),
                        reg_coef=fields["reg_coef"], rngs=rngs)
  return _routed_moe(ff, router, d_model=d_model, n_layers=n_layers, default_init="switch",
                     rngs=rngs)


@register_ff("noisy_topk")
def _build_noisy_topk(ff, *, d_model, n_layers, rngs):
  fields = _moe_fields(ff)
  router = NoisyTopKRouter(d_model, ff.n_experts, fields["k"], n_layers=n_layers,
                           reg_coef=fields["reg_coef"], rngs=rngs)
  return _routed_moe(ff, router, d_model=d_model, n_layers=n_layers, default_init="sigma",
                     rngs=rngs)


@register_ff("sbase")
def _build_sbase(ff, *, d_model, n_layers, rngs):
  fields = _moe_fields(ff)
  iters = ff.get("sinkhorn_iters", 3)
  validation.require_positive_int(iters, "model.ff.sinkhorn_iters")
  router = SBaseRouter(d_model, ff.n_experts, fields["k"], n_layers=n_layers,
                       sinkhorn_iters=iters, reg_coef=fields["reg_coef"], rngs=rngs)
  return _routed_moe(ff, router, d_model=d_model, n_layers=n_layers, default_init="sigma",
                     rngs=rngs)


@register_ff("softmax_moe")
def _build_softmax_moe(ff, *, d_model, n_layers, rngs):
  fields = _moe_fields(ff)
  renorm = ff.get("renorm")
  validation.require(isinstance(renorm, bool), "model.ff.renorm", "true or false", renorm)
  router = SoftmaxRouter(d_model, ff.n_experts, fields["k"], n_layers=n_layers, renorm=renorm,
                         reg_coef=fields["reg_coef"], rngs=rngs)
  return _routed_moe(ff, router, d_model=d_model, n_layers=n_layers, default_init="sigma",
                     rngs=rngs)


@register_ff("sparse_ff")
def _build_sparse_ff(ff, *, d_model, n_layers, rngs):
  validation.require_positive_int(ff.get("d_ff"), "model.ff.d_ff")
  block = ff.get("block_size")
  validation.require(isinstance(block, int) and block > 0 and ff.d_ff % block == 0,
                     "model.ff.block_size", f"a positive divisor of model.ff.d_ff={ff.d_ff}",
                     block)
  d_lowrank = ff.get("d_lowrank") or ff.d_ff // block  # Trax's default.
  validation.require_positive_int(d_lowrank, "model.ff.d_lowrank")
  temperature = ff.get("temperature", 0.1)
  validation.require(isinstance(temperature, (int, float)) and temperature > 0,
                     "model.ff.temperature", "a positive number", temperature)
  quant_prob = ff.get("quant_prob", 0.3)
  validation.require(isinstance(quant_prob, (int, float)) and 0 <= quant_prob <= 1,
                     "model.ff.quant_prob", "in [0, 1]", quant_prob)
  return SparseFF(d_model, ff.d_ff, block, d_lowrank, n_layers=n_layers,
                  temperature=float(temperature), quant_prob=float(quant_prob), rngs=rngs)
