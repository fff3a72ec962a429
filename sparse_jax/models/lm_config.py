"""The `model` section's schemas: `ModelConfig` (every model kind) and `LMConfig` (the decoder
LM, `models.lm.TransformerLM`), with the choices their fields allow.

Apart from the modules that use them, so that the LM, its blocks, the encoder, the accounting
and the config overrides import the schema without importing each other.
"""

from typing import Literal

import jax
import ml_collections

import pallas_kernels
from pallas_kernels.xl_attention import XL_IMPLS
from sparse_jax import schema, validation
from sparse_jax.layers import cudnn_attention
from sparse_jax.layers.precision import COMPUTE_DTYPES
from sparse_jax.layers.rotary import rotated_channels
from sparse_jax.layers.registry import FFConfig
from sparse_jax.models import plugins
from sparse_jax.models.remat import REMAT_KINDS

ATTENTION_KINDS = ("xl", "causal", "sparse_qkv", "switchhead", "switchhead_xl")
# The kinds with Transformer-XL relative positions and memory, and SwitchHead's two.
XL_KINDS = ("xl", "switchhead_xl")
SWITCHHEAD_KINDS = ("switchhead", "switchhead_xl")
# The kinds whose causal attention core `attention_core` picks (`layers.cudnn_attention`).
CORE_KINDS = ("causal", "switchhead")
ATTN_SCALES = ("fixed", "learned")
# `attention_impl`: the grouped-matmul impls (SwitchHead) and "xla" (XL attention's XLA path).
ATTENTION_IMPLS = tuple(dict.fromkeys(pallas_kernels.IMPLS + XL_IMPLS))
# "pre": LayerNorm before each sublayer; "peri": MoEUT's, the LayerNorm read only by Q, K and
# the routers, the values and the FF experts reading the raw residual (`models.blocks`).
BLOCK_NORMS = ("pre", "peri")
POSITIONS = ("rotary", "sinusoidal")

# Token embedding init: N(0, 1); Xavier-uniform over `[vocab, d_model]` as the sigma-MoE
# authors' code (about 65x smaller entries at vocabulary 8000, d_model 412); or
# N(0, 1 / d_model), torch's `kaiming_normal_` of MoEUT's code (fan-in d_model).
EMBED_INITS = {"normal": jax.nn.initializers.normal(1.0),
               "xavier": jax.nn.initializers.xavier_uniform(),
               "fan_in": jax.nn.initializers.variance_scaling(1.0, "fan_in", "normal",
                                                              in_axis=-1, out_axis=-2)}


class ModelConfig(schema.Schema, tag="kind", default="lm"):
  """The `model` section: `kind` "lm" (`LMConfig`, below) or "encoder"
  (`sparse_jax.models.encoder.EncoderConfig`), and the fields every model kind has."""

  kind: str  # "lm" or "encoder".
  vocab_size: schema.PositiveInt  # Tokens of the input and output vocabulary.
  d_model: schema.PositiveInt  # The residual stream's width.
  n_layers: schema.PositiveInt  # Blocks.
  n_heads: schema.PositiveInt  # Attention heads.
  dropout: schema.Probability  # Dropout of the embeddings and the sublayers' outputs.
  attn_dropout: schema.Probability = 0.0  # Dropout of the attention weights.
  dtype: Literal[tuple(COMPUTE_DTYPES)] = "float32"  # The compute dtype (docs/training.md).
  remat: Literal[REMAT_KINDS] = "none"  # Rematerialisation per block (`models.remat`).
  ff: FFConfig
  memory: plugins.MemoryConfig
  adapters: plugins.AdapterConfig

  def check(self, path: str) -> None:
    self.ff.check_width(self.d_model)


@ModelConfig.variant("lm")
class LMConfig(ModelConfig):
  """The `model` section of a decoder LM (`TransformerLM`)."""

  mem_len: schema.NonNegativeInt  # XL memory positions in training (XL_KINDS only).
  head_dim: schema.PositiveInt | None = None  # None: d_model // n_heads.
  attention: Literal[ATTENTION_KINDS] = "xl"  # The attention layer's kind.
  # Not XL_KINDS. "rotary": q and k rotated (`rotary_fraction` of their channels);
  # "sinusoidal": added to the embeddings.
  positions: Literal[POSITIONS] = "rotary"
  # The leading fraction of each head's channels that rotary positions rotate, rounded down to
  # even (`layers.rotary.rotated_channels`); None: all for causal, half for switchhead.
  rotary_fraction: schema.Probability | None = None
  # S, the modules of the sparse QKV layer (sparse_qkv attention only); None: n_heads.
  attention_sparsity: schema.PositiveInt | None = None
  # SwitchHead (SWITCHHEAD_KINDS only): E V and O experts per head, K of them active, and
  # the grouped-matmul impl they run on (`pallas_kernels.IMPLS`; their XL attention core runs
  # fused where "auto" would pick it, with "auto" or "pallas"). For "xl" attention, its core
  # (`pallas_kernels.xl_attention.XL_IMPLS`): "xla" (scores in memory), "pallas" (the fused
  # kernels; interpret mode off GPU; attn_dropout 0), "auto" (fused on one GPU with
  # attn_dropout 0, else "xla": CPU runs keep the XLA path).
  attention_experts: schema.PositiveInt | None = None  # E (SwitchHead).
  attention_k: schema.PositiveInt | None = None  # K (SwitchHead): experts active per head.
  attention_impl: Literal[ATTENTION_IMPLS] = "auto"  # SwitchHead's impl; "xl": its core.
  # CORE_KINDS only: where their causal attention is formed (`layers.cudnn_attention.CORES`):
  # "xla" (the [B, H, T, T] scores in memory), "cudnn" (cuDNN's fused flash attention; bfloat16,
  # a head dim that is a multiple of 8 and <= 128, attn_dropout 0), "auto" ("xla" until the
  # cuDNN path has run on a GPU).
  attention_core: Literal[cudnn_attention.CORES] = "auto"
  # MoEUT (Csordas et al. 2024): G distinct blocks repeated in order (ABAB...) to make
  # `n_layers` (None: every layer its own), the peri-LayerNorm, and its regulariser of the
  # routers over time and repeats per sequence (`models.moeut_regularizer`).
  layer_groups: schema.PositiveInt | None = None
  block_norm: Literal[BLOCK_NORMS] = "pre"  # Pre-LayerNorm, or MoEUT's peri-LayerNorm.
  moeut_ff_reg: schema.NonNegativeFloat = 0.0  # gamma: the sigma-MoE FF routers.
  moeut_attention_reg: schema.NonNegativeFloat = 0.0  # delta: SwitchHead's V and O routers.
  # The layers under one `jax.lax.scan` (`models.layer_scan`): XLA compiles one layer, not
  # `n_layers`; the same parameters, checkpoints and results as unrolled.
  scan_layers: bool = False
  # With mesh.tensor > 1: the residual stream, LayerNorms and dropout split along the sequence
  # between the tensor-parallel regions, and the XL memory likewise (`models.blocks`); the
  # same results, activations stored once per tensor group. No effect on one device.
  sequence_parallel: bool = False
  tie_embeddings: bool = False  # The output layer reuses the token embedding's table.
  loss_sparsity: schema.NonNegativeInt = 0  # S of the multiplicative output; 0: dense.
  # The token embedding's draw: "fan_in" N(0, 1/d_model), MoEUT's, Trax's and Flax's scale
  # (the sigma-MoE authors' Xavier is as small or smaller). "normal" N(0, 1) was the default
  # until 2026-11-29: it stalled 3 of 12 `quality_medium` runs (RESULTS.md, issue 61).
  embed_init: Literal[tuple(EMBED_INITS)] = "fan_in"
  # Multiplies the `embed_init` draw: intermediate scales ("normal" with 0.25 is N(0, 1/16)).
  embed_init_scale: schema.PositiveFloat = 1.0
  # Multiplies the embedding's output in the forward pass (Gemma's sqrt(d_model), muP's input
  # multiplier): a small draw times a multiplier reads like a large draw, but Adam moves the
  # stored table by about the learning rate a step, a larger relative change.
  embed_multiplier: schema.PositiveFloat = 1.0
  # Multiplies the init of each block's projections into the residual stream (attention's
  # output, the FF's down projection; the layers' `RESIDUAL_OUTPUTS`): 0 starts every block as
  # the identity (GPT-2 / nanoGPT scale these by 1/sqrt(2 n_layers); T-Fixup and ReZero by 0).
  residual_init_scale: schema.NonNegativeFloat = 1.0
  # The std of the XL attention's content and position biases u and v (0: zeros, Dai et al.'s
  # TensorFlow code draws them from its N(0, 0.02) initialiser). XL attention only.
  xl_bias_init_std: schema.NonNegativeFloat = 0.0
  # The sigma-MoE authors' Transformer-XL sets these three and Xavier (`paper_training`).
  output_dropout: bool = False  # Dropout (model.dropout) before the output layer.
  layer_norm_eps: schema.PositiveFloat = 1e-6  # The epsilon of every LayerNorm.
  attn_scale: Literal[ATTN_SCALES] = "fixed"  # "learned": XL attention only.

  def check(self, path: str) -> None:
    super().check(path)
    if self.attention == "sparse_qkv" or self.head_dim is None:
      validation.require(self.d_model % self.n_heads == 0, f"{path}.d_model",
                         f"divisible by {path}.n_heads={self.n_heads} (or set {path}.head_dim, "
                         "except for sparse_qkv attention)", self.d_model)
    validation.require(self.attention_sparsity is None or self.attention == "sparse_qkv",
                       f"{path}.attention_sparsity", "None unless attention is 'sparse_qkv'",
                       self.attention_sparsity)
    validation.require(not self.attention_sparsity or self.d_model % self.attention_sparsity == 0,
                       f"{path}.attention_sparsity",
                       f"None or a divisor of {path}.d_model={self.d_model}",
                       self.attention_sparsity)
    self._check_switchhead(path)
    self._check_attention_core(path)
    self._check_moeut(path)
    validation.require(self.loss_sparsity == 0 or self.vocab_size % self.loss_sparsity == 0,
                       f"{path}.loss_sparsity",
                       f"0 (dense) or a divisor of {path}.vocab_size={self.vocab_size}",
                       self.loss_sparsity)
    validation.require(not (self.loss_sparsity and self.tie_embeddings),
                       f"{path}.tie_embeddings", f"False with {path}.loss_sparsity", True)
    validation.require(self.rotary_fraction is None or
                       (self.attention in ("causal", "switchhead") and self.positions == "rotary"),
                       f"{path}.rotary_fraction",
                       "None unless attention is 'causal' or 'switchhead' with rotary positions",
                       self.rotary_fraction)
    validation.require(self.attn_scale == "fixed" or self.attention == "xl",
                       f"{path}.attn_scale", "'fixed' unless attention is 'xl'",
                       self.attn_scale)
    validation.require(self.xl_bias_init_std == 0 or self.attention == "xl",
                       f"{path}.xl_bias_init_std", "0 unless attention is 'xl'",
                       self.xl_bias_init_std)


  def _check_switchhead(self, path: str) -> None:
    """E >= 2 and 1 <= K <= E for SwitchHead, its fields left unset otherwise; the rotated
    half of a head (SwitchHeadRope) must be an even number of channels."""
    if self.attention not in SWITCHHEAD_KINDS:
      for name in ("attention_experts", "attention_k"):
        validation.require(getattr(self, name) is None, f"{path}.{name}",
                           f"None unless attention is one of {SWITCHHEAD_KINDS}",
                           getattr(self, name))
      if self.attention == "xl":
        validation.require(self.attention_impl in XL_IMPLS, f"{path}.attention_impl",
                           f"one of {XL_IMPLS} with 'xl' attention", self.attention_impl)
        validation.require(self.attention_impl != "pallas" or self.attn_dropout == 0,
                           f"{path}.attn_dropout",
                           f"0 with {path}.attention_impl='pallas' (the fused XL attention "
                           "has no attention dropout)", self.attn_dropout)
        return
      validation.require(self.attention_impl == "auto", f"{path}.attention_impl",
                         f"'auto' unless attention is 'xl' or one of {SWITCHHEAD_KINDS}",
                         self.attention_impl)
      return
    validation.require(self.attention_impl in pallas_kernels.IMPLS, f"{path}.attention_impl",
                       f"one of {pallas_kernels.IMPLS} with SwitchHead attention",
                       self.attention_impl)
    experts, k = self.attention_experts, self.attention_k
    validation.require(experts is not None and experts >= 2, f"{path}.attention_experts",
                       "an int >= 2 with SwitchHead attention (the V and O experts per head)",
                       experts)
    validation.require(k is not None and k <= experts, f"{path}.attention_k",
                       f"an int in [1, {path}.attention_experts={experts}]", k)
    rotary = self.attention == "switchhead" and self.positions == "rotary"
    validation.require(not rotary or rotated_channels(rotary_fraction_of(self),
                                                      head_dim_of(self)) >= 2,
                       f"{path}.head_dim",
                       f"a head size of which {path}.rotary_fraction rotates at least 2 "
                       "channels (rounded down to even)", head_dim_of(self))


  def _check_attention_core(self, path: str) -> None:
    """`attention_core` set only for CORE_KINDS, and "cudnn" only where cuDNN's fused
    attention runs: bfloat16, its head sizes, no attention dropout."""
    core = self.attention_core
    validation.require(core == "auto" or self.attention in CORE_KINDS, f"{path}.attention_core",
                       f"'auto' unless attention is one of {CORE_KINDS}", core)
    if core != "cudnn":
      return
    validation.require(self.dtype in cudnn_attention.CUDNN_DTYPES, f"{path}.dtype",
                       f"one of {cudnn_attention.CUDNN_DTYPES} with {path}.attention_core="
                       "'cudnn'", self.dtype)
    validation.require(cudnn_attention.cudnn_head_dim_ok(head_dim_of(self)), f"{path}.head_dim",
                       f"at most {cudnn_attention.CUDNN_MAX_HEAD_DIM} with "
                       f"{path}.attention_core='cudnn'", head_dim_of(self))
    validation.require(self.attn_dropout == 0, f"{path}.attn_dropout",
                       f"0 with {path}.attention_core='cudnn' (cuDNN's fused attention has no "
                       "attention dropout here)", self.attn_dropout)


  def _check_moeut(self, path: str) -> None:
    """Groups that divide the layers; the peri-LayerNorm and the regularisers only where the
    layers they need are (SwitchHead reads its values raw, sigma-MoE routes on the norm)."""
    validation.require(self.layer_groups is None or self.n_layers % self.layer_groups == 0,
                       f"{path}.layer_groups",
                       f"None or a divisor of {path}.n_layers={self.n_layers}",
                       self.layer_groups)
    ff_kind = getattr(self.ff, "kind", None)
    validation.require(
        self.block_norm == "pre" or (self.attention == "switchhead" and ff_kind == "sigma_moe"),
        f"{path}.block_norm", "'pre' unless attention is 'switchhead' and ff.kind 'sigma_moe'",
        self.block_norm)
    validation.require(not self.moeut_ff_reg or ff_kind == "sigma_moe", f"{path}.moeut_ff_reg",
                       "0 unless ff.kind is 'sigma_moe'", self.moeut_ff_reg)
    validation.require(not self.moeut_attention_reg or self.attention in SWITCHHEAD_KINDS,
                       f"{path}.moeut_attention_reg",
                       f"0 unless attention is one of {SWITCHHEAD_KINDS}",
                       self.moeut_attention_reg)


def validate_model_config(cfg: ml_collections.ConfigDict | dict | LMConfig) -> LMConfig:
  """The typed `model` section of a decoder LM, every field checked (FF and plug-ins too)."""
  return LMConfig.parse(cfg, "model")


def head_dim_of(cfg: "LMConfig") -> int:
  """`model.head_dim`, or `d_model // n_heads` when it is None."""
  return cfg.head_dim or cfg.d_model // cfg.n_heads


def rotary_fraction_of(cfg: "LMConfig") -> float:
  """`model.rotary_fraction`, or its default: half for SwitchHead (its authors'), else all."""
  if cfg.rotary_fraction is not None:
    return cfg.rotary_fraction
  return 0.5 if cfg.attention == "switchhead" else 1.0
