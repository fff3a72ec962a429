"""Terraformer's half-residual sublayers (Scaling Transformers Sec. 4; Trax 1.4
`reformer.DecoderBlock` / `EncoderBlock` and `configurable_transformer.FeedForwardWithOptions`).

A reversible block adds each sublayer's output to one stream and swaps the streams
(`sparse_jax.layers.reversible`); the sublayers here are what is added. The streams stay
float32 (so that running the blocks backwards recovers their inputs to float32 rounding);
each sublayer computes in `model.dtype` from its LayerNorm on:

- `AttentionHalf`: `Dropout(Attn(LN x))`, the attention being LSH (`layers.lsh_attention`),
  or dense: causal (dense or sparse QKV) in the decoder, bidirectional in the encoder;
- `FeedForwardHalf`: `Dropout(FF(LN x)) + Dense_d(SRU(Dense_r(LN' x)))`: the FF (dense or
  sparse, `model.ff`) plus Terraformer's low-rank SRU branch with its own LayerNorm
  (`layers.sru`, Sec. 4.3), when `sru_units > 0`.

Dropout (`model.shared_dropout`). True is Trax 1.4's placement and mask shapes: its
`ConfigurableTerraformer` builds the blocks with `dropout_shared_axes=[-2]`, and Trax's
`Dropout(shared_axes)` draws one mask of the input's shape with those axes set to 1:

- LSH attention with dense shared QK (`efficient_attention.LSHSelfAttention`): the output
  dropout (rate `dropout`) is one `[d_model]` mask for the whole call
  (`apply_broadcasted_dropout`, one RNG for all examples and heads), shared over batch and
  length. The dense attentions, whose projections are `tl.Dense` layers (`tl.Attention`,
  `tl.CausalAttention`), and the sparse QKV ones (`MultiplicativeConvCausalAttention`,
  `PureLSHSelfAttentionWrapper`) have no output dropout at all; every attention drops its
  probabilities (`model.attn_dropout`; in Trax the same rate as `dropout`).
- Dense FF (`configurable_transformer._FeedForward` then `FeedForwardWithOptions`): the
  hidden units at rate `ff_dropout` (None: `dropout`), mask `[B, 1, d_ff]`, and the output at
  rate `dropout`, mask `[B, 1, d_model]`: both shared along the length. (Trax drops the hidden
  units before the activation, `DenseFF` after it: the same for ReLU, Trax's Terraformer's.)
- Sparse FF (`sparsity.SparseFF`): no hidden dropout (`ff_dropout` is not used); the output
  at rate `dropout` under `BatchLeadingAxes`, which flattens `[B, T, d]` to `[B T, d]` before
  `shared_axes=[-2]`: one `[d_model]` mask per call, shared over batch and length.
- The SRU branch has no dropout.

False is this library's earlier placement: every attention's output and the FF's output
dropped at rate `dropout`, every element independently; the dense FF's hidden units by its
own `model.ff.dropout`.

Biases (`model.attention_bias`): the decoder's dense causal attention gets Q, K, V and
output biases as Trax's `tl.CausalAttention`; the encoder's dense attention has them either
way (Trax's `tl.Attention`; `BidirectionalSelfAttention`), sparse QKV has those of its
multiplicative layer and convolutions (as Trax), LSH none (as Trax).

Each has the reversible contract `y, loss, record = sublayer(x, replay=None)`: `record` holds
the discrete choices of the call (LSH buckets, the sparse FF's chosen units; `()` when there
are none) and `replay` gives them back when the block is recomputed backwards, so gradients
are exact. Decoding (`decode(x_b1d, cache, position)`) runs one token with the layer's cache.
"""

import jax
import jax.numpy as jnp
from flax import nnx

from sparse_jax.layers.bidirectional_attention import BidirectionalSelfAttention
from sparse_jax.layers.causal_attention import CausalSelfAttention
from sparse_jax.layers.lsh_attention import LSHSelfAttention
from sparse_jax.layers.normalization import layer_norm
from sparse_jax.layers.precision import COMPUTE_DTYPES
from sparse_jax.layers.registry import build_ff
from sparse_jax.layers.sparse_ff import SparseFF
from sparse_jax.layers.sparse_qkv_attention import SparseQKVAttention
from sparse_jax.layers.sru import LowRankSRU
from sparse_jax.models.terraformer_config import TerraformerConfig

# `nnx.Dropout(broadcast_dims=)` of `[B, T, d]` activations: Trax's `shared_axes=[-2]` (one
# mask per row, shared along the length), and one mask per call (shared by all rows too).
SHARED_ALONG_LENGTH = (-2,)
ONE_MASK_PER_CALL = (0, 1)


def build_attention(cfg: TerraformerConfig, *, causal: bool, n_layers: int,
                    rngs: nnx.Rngs) -> nnx.Module:
  """The decoder's (`causal`) or the encoder's self-attention of `cfg`."""
  kind = cfg.decoder_attention if causal else cfg.encoder_attention
  qkv = cfg.decoder_qkv if causal else "dense"
  if kind == "lsh":
    lsh = cfg.lsh
    return LSHSelfAttention(
        cfg.d_model, cfg.n_heads, n_layers=n_layers, n_hashes=lsh.n_hashes,
        n_buckets=lsh.n_buckets, chunk_len=lsh.chunk_len, n_chunks_before=1,
        n_chunks_after=0 if causal else 1, causal=causal, attn_dropout=cfg.attn_dropout,
        qkv=qkv, n_modules=cfg.attention_sparsity if qkv == "sparse" else None, rngs=rngs)
  if not causal:
    return BidirectionalSelfAttention(cfg.d_model, cfg.n_heads, attn_dropout=cfg.attn_dropout,
                                      rngs=rngs)
  if qkv == "sparse":
    return SparseQKVAttention(cfg.d_model, cfg.n_heads, n_modules=cfg.attention_sparsity,
                              n_layers=n_layers, attn_dropout=cfg.attn_dropout, rotary=False,
                              rngs=rngs)
  return CausalSelfAttention(cfg.d_model, cfg.n_heads, cfg.d_model // cfg.n_heads,
                             n_layers=n_layers, attn_dropout=cfg.attn_dropout, rotary=False,
                             use_bias=cfg.attention_bias, rngs=rngs)


def attention_output_dropout(cfg: TerraformerConfig, *, causal: bool,
                             rngs: nnx.Rngs) -> nnx.Dropout:
  """The dropout of an attention half's output (module docstring): with `shared_dropout`,
  one `[d_model]` mask per call after LSH attention with dense shared QK and none (rate 0)
  after the others; without, every element independently."""
  if not cfg.shared_dropout:
    return nnx.Dropout(cfg.dropout, rngs=rngs)
  is_lsh = (cfg.decoder_attention if causal else cfg.encoder_attention) == "lsh"
  dense_qk = not causal or cfg.decoder_qkv == "dense"
  if is_lsh and dense_qk:
    return nnx.Dropout(cfg.dropout, broadcast_dims=ONE_MASK_PER_CALL, rngs=rngs)
  return nnx.Dropout(0.0, rngs=rngs)


class AttentionHalf(nnx.Module):
  """`Dropout(Attn(LN x))`; the encoder's attention masks padded keys (`valid_bt`)."""

  def __init__(self, cfg: TerraformerConfig, *, causal: bool, n_layers: int, rngs: nnx.Rngs):
    self.causal = causal
    self.is_lsh = (cfg.decoder_attention if causal else cfg.encoder_attention) == "lsh"
    self.dtype = COMPUTE_DTYPES[cfg.dtype]
    self.norm = layer_norm(cfg.d_model, epsilon=cfg.layer_norm_eps, rngs=rngs)
    self.attn = build_attention(cfg, causal=causal, n_layers=n_layers, rngs=rngs)
    self.dropout = attention_output_dropout(cfg, causal=causal, rngs=rngs)

  def __call__(self, x_btd: jax.Array, valid_bt: jax.Array | None = None, *, replay=None):
    """`(y [B, T, d], 0.0, buckets or ())`; `valid_bt` (encoder only) marks real tokens."""
    h_btd = self.norm(x_btd).astype(self.dtype)
    if self.is_lsh:
      y_btd, record = self.attn(h_btd, valid_bt=valid_bt, buckets=replay)
    elif self.causal:
      y_btd, record = self.attn(h_btd), ()
    else:
      y_btd, record = self.attn(h_btd, valid_bt), ()
    return self.dropout(y_btd), jnp.zeros((), jnp.float32), record

  def init_cache(self, batch: int, max_len: int, dtype) -> dict:
    return self.attn.init_cache(batch, max_len, dtype)

  def decode(self, x_b1d: jax.Array, cache: dict, position: jax.Array):
    """One token of the causal attention: `(y [B, 1, d], cache)`."""
    y_b1d, cache = self.attn.decode(self.norm(x_b1d).astype(self.dtype), cache, position)
    return self.dropout(y_b1d), cache


class FeedForwardHalf(nnx.Module):
  """`Dropout(FF(LN x))`, plus `Dense_d(SRU_r(Dense_r(LN' x)))` when `cfg.sru_units = r > 0`.

  With `shared_dropout` the dense FF's hidden dropout is replaced by Trax's (rate `ff_dropout`,
  None: `dropout`; shared along the length), so its own `ff.dropout` must be 0; without,
  `ff_dropout` must be None (module docstring).
  """

  def __init__(self, cfg: TerraformerConfig, *, n_layers: int, rngs: nnx.Rngs):
    self.dtype = COMPUTE_DTYPES[cfg.dtype]
    self.norm = layer_norm(cfg.d_model, epsilon=cfg.layer_norm_eps, rngs=rngs)
    self.ff = build_ff(cfg.ff, d_model=cfg.d_model, n_layers=n_layers, rngs=rngs)
    if cfg.shared_dropout:
      sparse = cfg.ff.kind == "sparse_ff"
      self.dropout = nnx.Dropout(cfg.dropout, rngs=rngs, broadcast_dims=(
          ONE_MASK_PER_CALL if sparse else SHARED_ALONG_LENGTH))
      if cfg.ff.kind == "dense":  # `TerraformerConfig.check`: its own dropout is 0.
        rate = cfg.dropout if cfg.ff_dropout is None else cfg.ff_dropout
        self.ff.dropout = nnx.Dropout(rate, broadcast_dims=SHARED_ALONG_LENGTH, rngs=rngs)
    else:
      self.dropout = nnx.Dropout(cfg.dropout, rngs=rngs)
    if cfg.sru_units:
      self.sru_norm = layer_norm(cfg.d_model, epsilon=cfg.layer_norm_eps, rngs=rngs)
      self.sru = LowRankSRU(cfg.d_model, cfg.sru_units, n_layers=n_layers, rngs=rngs)
    else:
      self.sru_norm, self.sru = None, None

  def __call__(self, x_btd: jax.Array, valid_bt: jax.Array | None = None, *, replay=None):
    """`(y [B, T, d], FF regulariser, the sparse FF's choices or ())`; `valid_bt` unused
    (position-wise, and the SRU is causal: padding only follows the real tokens)."""
    del valid_bt
    h_btd = self.norm(x_btd).astype(self.dtype)
    if isinstance(self.ff, SparseFF):
      y_btd, aux, record = self.ff.replayable(h_btd, replay)
    else:
      (y_btd, aux), record = self.ff(h_btd), ()
    y_btd = self.dropout(y_btd)
    if self.sru is not None:
      y_btd = y_btd + self.sru(self.sru_norm(x_btd).astype(self.dtype))
    return y_btd, aux["reg_loss"].astype(jnp.float32), record

  def init_cache(self, batch: int, max_len: int, dtype):
    """The SRU's carry `[B, r]` (None without the branch)."""
    del max_len
    return None if self.sru is None else self.sru.init_cache(batch, dtype)

  def decode(self, x_b1d: jax.Array, carry, position: jax.Array):
    """One token, the FF's sparse decode path when it has one: `(y [B, 1, d], carry)`."""
    del position
    h_b1d = self.norm(x_b1d).astype(self.dtype)
    y_b1d = self.ff.decode(h_b1d) if self.ff.has_sparse_decode else self.ff(h_b1d)[0]
    y_b1d = self.dropout(y_b1d)
    if self.sru is not None:
      branch_b1d, carry = self.sru.decode(self.sru_norm(x_b1d).astype(self.dtype), carry)
      y_b1d = y_b1d + branch_b1d
    return y_b1d, carry
