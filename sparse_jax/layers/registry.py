"""The feed-forward registry: `model.ff.kind` -> (config schema, constructor).

Every feed-forward replacement (dense, top-k, PKM, the MoEs, ...) is built through here, so a
model picks its FF layer by config alone. Adding a kind means one layer file, one `FFConfig`
subclass holding that kind's fields (types, ranges and defaults, checked when the config is
parsed, before anything is built) and one builder registered with it:

    @register_ff("dense", DenseFFConfig)
    def _build_dense(ff: DenseFFConfig, *, d_model, n_layers, rngs): ...
"""

from typing import Callable, Literal

from flax import nnx

import pallas_kernels
from sparse_jax import schema, validation
from sparse_jax.layers import moe, pkm
from sparse_jax.layers.dense_ff import ACTIVATIONS, DenseFF
from sparse_jax.layers.routers import (NoisyTopKRouter, SBaseRouter, SoftmaxRouter, SwitchRouter,
                                       noisy_topk, sbase, softmax, switch)
from sparse_jax.layers.sparse_ff import SparseFF
from sparse_jax.layers.topk_ff import TopKFF

FFBuilder = Callable[..., nnx.Module]
_FF_BUILDERS: dict[str, FFBuilder] = {}


class FFConfig(schema.Schema, tag="kind"):
  """The `model.ff` section: `kind` picks the schema of the other fields."""

  kind: str  # The feed-forward layer: one of the kinds below (`ff_kinds()`).

  def check_width(self, d_model: int) -> None:
    """Rules that involve the model width (`model.d_model`); none by default."""


def register_ff(kind: str, config: type[FFConfig]) -> Callable[[FFBuilder], FFBuilder]:
  """Registers `builder(ff: config, *, d_model, n_layers, rngs) -> module` for `kind`."""

  def decorate(builder: FFBuilder) -> FFBuilder:
    FFConfig.variant(kind)(config)  # Raises if `kind` is registered twice.
    _FF_BUILDERS[kind] = builder
    return builder

  return decorate


def ff_kinds() -> list[str]:
  return sorted(_FF_BUILDERS)


def parse_ff(ff, path: str = "model.ff") -> FFConfig:
  """The typed FF section (from a ConfigDict, a dict or an `FFConfig`)."""
  return FFConfig.parse(ff, path)


def build_ff(ff, *, d_model: int, n_layers: int, rngs: nnx.Rngs) -> nnx.Module:
  """Builds the FF layer that `ff.kind` names, from the other fields of `ff`."""
  ff = parse_ff(ff)
  ff.check_width(d_model)
  return _FF_BUILDERS[ff.kind](ff, d_model=d_model, n_layers=n_layers, rngs=rngs)


def _require_at_most(value: int, limit: int, field: str, limit_name: str) -> None:
  validation.require(value <= limit, field, f"an integer in [1, {limit_name}={limit}]", value)


class DenseFFConfig(FFConfig):
  d_ff: schema.PositiveInt  # Hidden units.
  dropout: schema.Probability = 0.0  # Dropout of the hidden units in training.
  activation: Literal[tuple(ACTIVATIONS)] = "relu"  # Of the hidden units (gelu: erf, BERT's).


@register_ff("dense", DenseFFConfig)
def _build_dense(ff: DenseFFConfig, *, d_model, n_layers, rngs):
  return DenseFF(d_model, ff.d_ff, n_layers=n_layers, dropout=ff.dropout,
                 activation=ff.activation, rngs=rngs)


class TopKFFConfig(FFConfig):
  d_ff: schema.PositiveInt  # Hidden units.
  k: schema.PositiveInt  # Hidden units kept per token (the largest), the others zeroed.
  dropout: schema.Probability = 0.0  # Dropout of the hidden units in training.
  after_dropout: bool = False  # Top-K of the dropped-out units (the authors' code).

  def check(self, path: str) -> None:
    _require_at_most(self.k, self.d_ff, f"{path}.k", f"{path}.d_ff")


@register_ff("topk", TopKFFConfig)
def _build_topk(ff: TopKFFConfig, *, d_model, n_layers, rngs):
  return TopKFF(d_model, ff.d_ff, ff.k, n_layers=n_layers, dropout=ff.dropout,
                after_dropout=ff.after_dropout, rngs=rngs)


class PKMConfig(FFConfig):
  n_subkeys: schema.PositiveInt  # Sub-keys per half: n_subkeys ** 2 values (Lample et al.).
  knn: schema.PositiveInt  # Values read per head (the best knn product keys).
  n_heads: schema.PositiveInt = 4  # Query heads, each reading its own knn values.
  activation: Literal[pkm.ACTIVATIONS] = "relu"  # Of the selected scores (module pkm).
  init: Literal[pkm.INITS] = "authors"  # Of the keys and values (module pkm).
  dense_when_knn_covers: bool = True  # knn >= n_subkeys: the authors' dense path.

  def check(self, path: str) -> None:
    _require_at_most(self.knn, self.n_subkeys ** 2, f"{path}.knn", f"{path}.n_subkeys^2")

  def check_width(self, d_model: int) -> None:
    validation.require(d_model % 2 == 0, "model.d_model", "even for a PKM", d_model)


@register_ff("pkm", PKMConfig)
def _build_pkm(ff: PKMConfig, *, d_model, n_layers, rngs):
  return pkm.PKM(d_model, ff.n_subkeys, ff.knn, n_layers=n_layers, n_heads=ff.n_heads,
                 activation=ff.activation, init=ff.init,
                 dense_when_knn_covers=ff.dense_when_knn_covers, rngs=rngs)


class MoEConfig(FFConfig):
  """The fields every MoE kind shares: the experts (Eq. 11) and the regulariser's weight."""

  n_experts: schema.PositiveInt  # Experts (E).
  expert_size: schema.PositiveInt  # Hidden units of each expert (G).
  reg_coef: schema.NonNegativeFloat  # The weight of the router's regulariser in the loss.
  # The experts' init (`layers.moe.expert_stds`): sigma-MoE's, the "standard" ablation, or
  # Switch's ("switch", "fedus").
  init: Literal[moe.EXPERT_INITS] = "sigma"
  impl: Literal[pallas_kernels.IMPLS] = "auto"  # The grouped matmul (`pallas_kernels.cvmm`).
  expert_hidden_dropout: schema.Probability = 0.0  # Dropout of the experts' hidden units.

  def experts(self, router, *, d_model: int, n_layers: int, rngs: nnx.Rngs) -> moe.MoE:
    """The expert computation of this config behind `router`."""
    return moe.MoE(d_model, self.n_experts, self.expert_size, router, n_layers=n_layers,
                   init=self.init, impl=self.impl,
                   expert_hidden_dropout=self.expert_hidden_dropout, rngs=rngs)


class TopKMoEConfig(MoEConfig):
  """An MoE that routes each token to its `k` best experts."""

  k: schema.PositiveInt  # Experts per token.

  def check(self, path: str) -> None:
    _require_at_most(self.k, self.n_experts, f"{path}.k", f"{path}.n_experts")


class SigmaMoEConfig(TopKMoEConfig):
  # In training, each expert is removed for a token before its top-k with this probability.
  expert_dropout: schema.Probability = 0.0


@register_ff("sigma_moe", SigmaMoEConfig)
def _build_sigma_moe(ff: SigmaMoEConfig, *, d_model, n_layers, rngs):
  return moe.SigmaMoE(d_model, ff.n_experts, ff.expert_size, ff.k, n_layers=n_layers,
                      expert_dropout=ff.expert_dropout, reg_coef=ff.reg_coef, init=ff.init,
                      impl=ff.impl, expert_hidden_dropout=ff.expert_hidden_dropout, rngs=rngs)


class SwitchConfig(MoEConfig):
  """Defaults are the authors' runs; `capacity_factor` (e.g. 1.25), `balance="eq17"` and
  `init="fedus"` are the paper text's Switch."""

  capacity_factor: schema.PositiveFloat | None = None  # None: no token is dropped.
  balance: Literal[switch.BALANCE_LOSSES] = "authors"  # The balance loss: authors' or Eq. 17.
  init: Literal[moe.EXPERT_INITS] = "switch"  # As MoE's `init`, Switch's by default.


@register_ff("switch", SwitchConfig)
def _build_switch(ff: SwitchConfig, *, d_model, n_layers, rngs):
  selector_init = ff.init if ff.init in ("switch", "fedus") else "sigma"
  router = SwitchRouter(d_model, ff.n_experts, n_layers=n_layers,
                        capacity_factor=ff.capacity_factor, reg_coef=ff.reg_coef,
                        balance=ff.balance, selector_init=selector_init, rngs=rngs)
  return ff.experts(router, d_model=d_model, n_layers=n_layers, rngs=rngs)


class NoisyTopKConfig(TopKMoEConfig):
  """Noisy softmax gating (Shazeer et al.); `balance` "cv" is the paper's Eq. 14."""

  balance: Literal[noisy_topk.BALANCE_LOSSES] = "cv"  # Coefficient of variation, or squared.


@register_ff("noisy_topk", NoisyTopKConfig)
def _build_noisy_topk(ff: NoisyTopKConfig, *, d_model, n_layers, rngs):
  router = NoisyTopKRouter(d_model, ff.n_experts, ff.k, n_layers=n_layers,
                           reg_coef=ff.reg_coef, balance=ff.balance, rngs=rngs)
  return ff.experts(router, d_model=d_model, n_layers=n_layers, rngs=rngs)


class SBaseConfig(TopKMoEConfig):
  """Defaults are the authors' runs; `balance_over="batch"` with `sinkhorn="standard"` is
  the paper text's Sinkhorn over the batch."""

  sinkhorn_iters: schema.PositiveInt = 3  # Sinkhorn normalisation rounds.
  expert_dropout: schema.Probability = 0.0  # As sigma_moe's.
  balance_over: Literal[sbase.BALANCE_OVER] = "sequence"  # Tokens balanced together.
  sinkhorn: Literal[sbase.SINKHORNS] = "authors"  # The authors' Sinkhorn, or the standard one.


@register_ff("sbase", SBaseConfig)
def _build_sbase(ff: SBaseConfig, *, d_model, n_layers, rngs):
  router = SBaseRouter(d_model, ff.n_experts, ff.k, n_layers=n_layers,
                       sinkhorn_iters=ff.sinkhorn_iters, reg_coef=ff.reg_coef,
                       expert_dropout=ff.expert_dropout, balance_over=ff.balance_over,
                       sinkhorn_form=ff.sinkhorn, rngs=rngs)
  return ff.experts(router, d_model=d_model, n_layers=n_layers, rngs=rngs)


class SoftmaxMoEConfig(TopKMoEConfig):
  renorm: bool  # Renormalise the k kept probabilities to sum to 1 (App. A.1).
  expert_dropout: schema.Probability = 0.0  # As sigma_moe's.
  # The logits the regulariser reads (`layers.routers.softmax`): the authors' or all.
  reg_logits: Literal[softmax.REG_LOGITS] = "authors"


@register_ff("softmax_moe", SoftmaxMoEConfig)
def _build_softmax_moe(ff: SoftmaxMoEConfig, *, d_model, n_layers, rngs):
  router = SoftmaxRouter(d_model, ff.n_experts, ff.k, n_layers=n_layers, renorm=ff.renorm,
                         reg_coef=ff.reg_coef, expert_dropout=ff.expert_dropout,
                         reg_logits=ff.reg_logits, rngs=rngs)
  return ff.experts(router, d_model=d_model, n_layers=n_layers, rngs=rngs)


class SparseFFConfig(FFConfig):
  """Scaling Transformers' SparseFF. Defaults are Trax 1.4's `SparseFF`; the paper text's
  layer is `up_bias=True, mask_placement="post_relu"` (`soft_mask="noisy"` and
  `controller_init="normal"` are this library's earlier choices)."""

  d_ff: schema.PositiveInt  # Hidden units.
  block_size: schema.PositiveInt  # Units per block, one of which each token keeps.
  d_lowrank: schema.PositiveInt | None = None  # None: d_ff // block_size (Trax's default).
  temperature: schema.PositiveFloat = 0.1  # Of the Gumbel noise in training.
  quant_prob: float = 0.3  # In training, the chance a call uses the hard one-hot mask.
  soft_mask: Literal[SparseFF.SOFT_MASKS] = "clean"  # softmax of the clean logits (Trax).
  controller_init: Literal[SparseFF.CONTROLLER_INITS] = "glorot"  # C1, C2 (Trax).
  up_bias: bool = False  # b1 on x W1 (the paper has it, Trax not).
  mask_placement: Literal[SparseFF.MASK_PLACEMENTS] = "pre_relu"  # ReLU(x W1 * m) (Trax).

  def check(self, path: str) -> None:
    validation.require(self.d_ff % self.block_size == 0, f"{path}.block_size",
                       f"a positive divisor of {path}.d_ff={self.d_ff}", self.block_size)
    validation.require(0 <= self.quant_prob <= 1, f"{path}.quant_prob", "in [0, 1]",
                       self.quant_prob)


@register_ff("sparse_ff", SparseFFConfig)
def _build_sparse_ff(ff: SparseFFConfig, *, d_model, n_layers, rngs):
  return SparseFF(
      d_model, ff.d_ff, ff.block_size, ff.d_lowrank or ff.d_ff // ff.block_size,
      n_layers=n_layers, temperature=ff.temperature, quant_prob=ff.quant_prob,
      soft_mask=ff.soft_mask, controller_init=ff.controller_init, up_bias=ff.up_bias,
      mask_placement=ff.mask_placement, rngs=rngs)
