"""The `model` section's schema of a Terraformer (`models.terraformer.Terraformer`) and the
choices its fields allow; apart from the model so that its blocks, the accounting and the tasks
import it without importing each other.
"""

from typing import Literal

from sparse_jax import schema, validation
from sparse_jax.layers.precision import COMPUTE_DTYPES
from sparse_jax.layers.registry import FFConfig
from sparse_jax.models.remat import REMAT_KINDS

ATTENTIONS = ("lsh", "dense")
QKV_KINDS = ("dense", "sparse")
REVERSIBLE_FF_KINDS = ("dense", "sparse_ff")  # No routing choices the replay cannot cover.
POSITIONS = ("fixed_base", "sinusoid")
EMBEDDING_INITS = ("uniform", "normal")

class LSHConfig(schema.Schema):
  """`model.lsh`: LSH attention's hashing (Sec. 4.1; the paper's summarisation setting)."""

  n_hashes: schema.PositiveInt = 2  # Rounds of hashing, each its own bucketing.
  n_buckets: schema.PositiveInt = 128  # Buckets per round (even).
  chunk_len: schema.PositiveInt = 128  # Sorted positions attending together.

  def check(self, path: str) -> None:
    validation.require(self.n_buckets % 2 == 0, f"{path}.n_buckets", "an even integer",
                       self.n_buckets)


class TerraformerConfig(schema.Schema):
  """The `model` section of a Terraformer (module docstring)."""

  kind: Literal["terraformer"] = "terraformer"  # Picks this schema and the seq2seq task.
  vocab_size: schema.PositiveInt  # Tokens of the input and output vocabulary.
  d_model: schema.PositiveInt  # The residual stream's width.
  n_heads: schema.PositiveInt  # Attention heads.
  n_encoder_layers: schema.PositiveInt  # Encoder blocks.
  n_decoder_layers: schema.PositiveInt  # Decoder blocks.
  n_decoder_attention_layers: schema.PositiveInt = 2  # Attention half-residuals per block.
  dropout: schema.Probability = 0.1  # Dropout rate of the sublayers' outputs.
  attn_dropout: schema.Probability = 0.0  # Dropout of the attention weights.
  ff: FFConfig
  sru_units: schema.NonNegativeInt = 32  # 0: no SRU branch.
  encoder_attention: Literal[ATTENTIONS] = "lsh"  # LSH or dense self-attention.
  decoder_attention: Literal[ATTENTIONS] = "lsh"  # LSH or dense causal self-attention.
  decoder_qkv: Literal[QKV_KINDS] = "dense"  # The decoder attention's Q, K, V projections.
  attention_sparsity: schema.PositiveInt | None = None  # S of sparse QKV; None: n_heads.
  lsh: LSHConfig
  loss_sparsity: schema.NonNegativeInt = 0  # S of the multiplicative output; 0: dense.
  reversible: bool = True  # Reversible blocks: activations recomputed in the backward pass.
  # Trax's Terraformer as `ConfigurableTerraformer` trains it (REFERENCE.md 2d) by default;
  # the alternatives are this library's earlier choices, kept as options.
  # "fixed_base": Trax's learned fixed-base encoding with random start offsets in training
  # (`layers.fixed_base_positions`); "sinusoid": fixed sinusoids from position 0.
  positions: Literal[POSITIONS] = "fixed_base"
  # "uniform": U(+-sqrt(3 / d_model)), std 1/sqrt(d_model), Trax's `Embedding`; "normal": N(0, 1).
  embedding_init: Literal[EMBEDDING_INITS] = "uniform"
  # Trax's dropout placement and masks (`dropout_shared_axes=[-2]`, `models.terraformer_blocks`):
  # embedding [B, 1, d], FF hidden [B, 1, d_ff] and output [B, 1, d] masks shared along the
  # length, the sparse FF's and LSH attention's output one [d] mask per call, no output dropout
  # after dense or sparse QKV attention. False: all elementwise, attention outputs dropped too.
  shared_dropout: bool = True
  # With shared_dropout, the dense FF's hidden-unit dropout rate (Trax's `ff_dropout`; None:
  # `dropout`, as Trax); then `ff.dropout` must be 0. The sparse FF has none (Trax's SparseFF).
  ff_dropout: schema.Probability | None = None
  # Q, K, V and output biases on the decoder's dense causal attention (Trax `tl.CausalAttention`'s
  # `tl.Dense`s); the dense encoder attention has them either way. False: none (earlier).
  attention_bias: bool = True
  # Trax's `reversible_encoder=True` (its C4 gin): the encoder's two streams are each joined
  # to the decoder inputs, without the averaging Dense + LayerNorm of the default join.
  reversible_encoder: bool = False
  layer_norm_eps: schema.PositiveFloat = 1e-6  # The epsilon of every LayerNorm.
  # The sublayers' compute dtype; the reversible streams stay float32 (docs/training.md).
  dtype: Literal[tuple(COMPUTE_DTYPES)] = "float32"
  remat: Literal[REMAT_KINDS] = "none"  # See check().

  def check(self, path: str) -> None:
    self.ff.check_width(self.d_model)
    validation.require(self.remat == "none", f"{path}.remat",
                       "'none': Terraformer's memory saving is its reversible stack, whose "
                       f"backward pass recomputes activations already ({path}.reversible=True)",
                       self.remat)
    validation.require(self.ff.kind in REVERSIBLE_FF_KINDS, f"{path}.ff.kind",
                       f"one of {REVERSIBLE_FF_KINDS} (choices a reversible block can replay)",
                       self.ff.kind)
    ff_dropout = getattr(self.ff, "dropout", 0.0)
    validation.require(not (self.shared_dropout and ff_dropout), f"{path}.ff.dropout",
                       f"0 when {path}.shared_dropout (the FF's hidden dropout is then "
                       f"{path}.ff_dropout, as Trax's)", ff_dropout)
    validation.require(self.shared_dropout or self.ff_dropout is None, f"{path}.ff_dropout",
                       f"None unless {path}.shared_dropout (the FF's hidden dropout is then "
                       f"{path}.ff.dropout)", self.ff_dropout)
    validation.require(self.d_model % self.n_heads == 0, f"{path}.d_model",
                       f"divisible by {path}.n_heads={self.n_heads}", self.d_model)
    validation.require(self.attention_sparsity is None or self.decoder_qkv == "sparse",
                       f"{path}.attention_sparsity", "None unless decoder_qkv is 'sparse'",
                       self.attention_sparsity)
    validation.require(not self.attention_sparsity or self.d_model % self.attention_sparsity == 0,
                       f"{path}.attention_sparsity", f"a divisor of {path}.d_model={self.d_model}",
                       self.attention_sparsity)
    validation.require(self.loss_sparsity == 0 or self.vocab_size % self.loss_sparsity == 0,
                       f"{path}.loss_sparsity",
                       f"0 (dense) or a divisor of {path}.vocab_size={self.vocab_size}",
                       self.loss_sparsity)
