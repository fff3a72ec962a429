"""Terraformer: the sparse, reversible encoder-decoder of Scaling Transformers (Sec. 4).

As Trax 1.4 `ConfigurableTerraformer` builds it (REFERENCE.md 2c, 2d):

    x = Pos_e(Dropout(Embed(inputs)))            fixed-base positions, the encoder's own
    e1, e2 = Encoder(x, x)                       reversible blocks [attn, FF]; then both
                                                 streams LN(Dense((e1 + e2) / 2))
    h_i = [e_i without its padding; Pos_d(Dropout(Embed(shift_right(targets)))); padding]
    h1, h2 = Decoder(h_1, h_2)                   reversible blocks [attn, attn, FF],
                                                 causal over the whole concatenation
    logits = Out(strip(LN((h1 + h2) / 2)))       the decoder positions only

Encoder-decoder attention is replaced by the concatenation: every decoder position sees the
encoder's output through causal self-attention (Sec. 4). Attention is LSH (Sec. 4.1) or dense
(`model.encoder_attention`, `model.decoder_attention`; dense decoder attention may use sparse
QKV, `model.decoder_qkv`), the FF is dense or sparse (`model.ff`, Sec. 3.1) with the low-rank
SRU branch beside it (`model.sru_units`, Sec. 4.3), the output is dense or multiplicative
(`model.loss_sparsity`, Sec. 3.3). With `model.reversible` the backward pass recomputes each
block from its outputs (Sec. 4.2, `layers.reversible`); `False` stores activations as usual
(the same function: a baseline and a check). Token 0 is padding.

Trax's training details are the defaults, each with this library's earlier choice as an
option (`models.terraformer_config`): `positions="fixed_base"` (Trax's learned encoding with
random start offsets in training, `layers.fixed_base_positions`; "sinusoid": fixed sinusoids
from 0, added before the dropout), `embedding_init="uniform"` (std 1/sqrt(d_model)),
`shared_dropout` (Trax's dropout sites and mask shapes, `models.terraformer_blocks`).
`reversible_encoder=True` (Trax's C4 setting; off by default, as in Trax) joins each encoder
stream to the decoder as it is, without the Dense + LayerNorm.

Training: `logits, aux = model(inputs_bs, targets_bt)`. Decoding (`greedy_decode`) runs one
concatenated position at a time through the decoder's caches: the encoder's outputs first,
then the generated tokens. The `model` section's schema is
`models.terraformer_config.TerraformerConfig`.
"""

import math

import jax
import jax.numpy as jnp
from flax import nnx

from sparse_jax.layers.bidirectional_attention import Linear
from sparse_jax.layers.fixed_base_positions import FixedBasePositions
from sparse_jax.layers.multiplicative_dense import MultiplicativeDense
from sparse_jax.layers.normalization import layer_norm
from sparse_jax.layers.precision import COMPUTE_DTYPES, f32_einsum
from sparse_jax.layers.reversible import pure_half_residual, reversible_stack, sequential_stack
from sparse_jax.layers.xl_attention import sinusoid_embedding
from sparse_jax.models.terraformer_blocks import AttentionHalf, FeedForwardHalf
from sparse_jax.models.terraformer_config import TerraformerConfig

PAD = 0  # The padding token.
# `model.embedding_init`: Trax's `Embedding` (uniform, std 1/sqrt(d_model)) or N(0, 1).
EMBEDDING_INITS = {"uniform": jax.nn.initializers.variance_scaling(1.0, "fan_out", "uniform"),
                   "normal": jax.nn.initializers.normal(1.0)}


def shift_right(targets_bt: jax.Array) -> jax.Array:
  """Decoder inputs: PAD (the start token) then the targets but the last."""
  return jnp.pad(targets_bt, ((0, 0), (1, 0)), constant_values=PAD)[:, :-1]


def concat_index(n_valid_b: jax.Array, s: int, t: int) -> jax.Array:
  """`[B, S + T]` rows of `[enc (S); dec (T); zero]` making each row `[enc[:n]; dec; pad]`.

  Trax's `ConcatWithPadding`: the encoder's padding is removed, the decoder follows its last
  real token, and the rest is padding (row S + T, a zero vector), which causal attention and
  the SRU never look back at.
  """
  p = jnp.arange(s + t)[None, :]
  n = n_valid_b[:, None]
  return jnp.where(p < n, p, jnp.where(p < n + t, s + p - n, s + t))


def concat_with_padding(enc_bsd: jax.Array, n_valid_b: jax.Array, dec_btd: jax.Array):
  """`[B, S + T, d]`: each row's real encoder outputs, then its decoder inputs, then zeros."""
  b, s, d = enc_bsd.shape
  t = dec_btd.shape[1]
  rows = jnp.concatenate([enc_bsd, dec_btd.astype(enc_bsd.dtype),
                          jnp.zeros((b, 1, d), enc_bsd.dtype)], axis=1)
  return jnp.take_along_axis(rows, concat_index(n_valid_b, s, t)[..., None], axis=1)


def strip_decoder(h_bld: jax.Array, n_valid_b: jax.Array, t: int) -> jax.Array:
  """`[B, T, d]`: the decoder's positions `n_b .. n_b + T - 1` of each concatenated row."""
  index_bt = n_valid_b[:, None] + jnp.arange(t)[None, :]
  return jnp.take_along_axis(h_bld, index_bt[..., None], axis=1)


class Terraformer(nnx.Module):
  """The encoder-decoder of the module docstring; `logits, aux = model(inputs, targets)`."""

  def __init__(self, cfg, *, rngs: nnx.Rngs):
    cfg = TerraformerConfig.parse(cfg, "model")
    self.d_model, self.vocab_size, self.reversible = cfg.d_model, cfg.vocab_size, cfg.reversible
    self.dtype = COMPUTE_DTYPES[cfg.dtype]
    depth = cfg.n_encoder_layers + cfg.n_decoder_layers
    self.embed = nnx.Embed(cfg.vocab_size, cfg.d_model,
                           embedding_init=EMBEDDING_INITS[cfg.embedding_init],
                           embedding_metadata={"logical_axes": ("vocab", "embed")}, rngs=rngs)
    # Trax shares one embedding-dropout mask along the length axis (`shared_axes=[-2]`).
    self.embed_dropout = nnx.Dropout(cfg.dropout, broadcast_dims=(1,) if cfg.shared_dropout
                                     else (), rngs=rngs)
    if cfg.positions == "fixed_base":  # One for each side, as Trax's (not shared).
      self.encoder_positions = FixedBasePositions(cfg.d_model, rngs=rngs)
      self.decoder_positions = FixedBasePositions(cfg.d_model, rngs=rngs)
    else:
      self.encoder_positions = self.decoder_positions = None
    self.encoder = nnx.List([
        half for _ in range(cfg.n_encoder_layers)
        for half in (AttentionHalf(cfg, causal=False, n_layers=depth, rngs=rngs),
                     FeedForwardHalf(cfg, n_layers=depth, rngs=rngs))])
    if cfg.reversible_encoder:
      self.encoder_out, self.encoder_norm = None, None
    else:
      self.encoder_out = Linear(
          cfg.d_model, cfg.d_model,
          kernel_init=jax.nn.initializers.normal(1.0 / math.sqrt(cfg.d_model)),
          kernel_metadata={"logical_axes": ("embed", "embed")},
          bias_metadata={"logical_axes": ("embed",)}, rngs=rngs)
      self.encoder_norm = layer_norm(cfg.d_model, epsilon=cfg.layer_norm_eps, rngs=rngs)
    self.decoder = nnx.List([
        half for _ in range(cfg.n_decoder_layers)
        for half in ([AttentionHalf(cfg, causal=True, n_layers=depth, rngs=rngs)
                      for _ in range(cfg.n_decoder_attention_layers)]
                     + [FeedForwardHalf(cfg, n_layers=depth, rngs=rngs)])])
    self.final_norm = layer_norm(cfg.d_model, epsilon=cfg.layer_norm_eps, rngs=rngs)
    if cfg.loss_sparsity:
      self.sparse_out = MultiplicativeDense(cfg.d_model, cfg.vocab_size, cfg.loss_sparsity,
                                            out_axes=("vocab", "vocab"), rngs=rngs)
      self.w_out = None
    else:
      self.sparse_out = None
      self.w_out = nnx.Param(jax.nn.initializers.normal(1.0 / math.sqrt(cfg.d_model))(
          rngs.params(), (cfg.d_model, cfg.vocab_size)), logical_axes=("embed", "vocab"))
    self.b_out = nnx.Param(jnp.zeros((cfg.vocab_size,)), logical_axes=("vocab",))
    self.stack_rngs = rngs["dropout"].fork()

  def _embed(self, tokens_bt: jax.Array, positions: FixedBasePositions | None) -> jax.Array:
    """Embedded tokens with positions: Trax's order for fixed-base ones (embedding, dropout,
    then `positions`, which draws its random start in training), or sinusoids from 0 added
    before the dropout (`model.positions="sinusoid"`)."""
    if positions is None:
      sinusoids_td = sinusoid_embedding(jnp.arange(tokens_bt.shape[1]), self.d_model)
      return self.embed_dropout(self.embed(tokens_bt) + sinusoids_td)
    return positions(self.embed_dropout(self.embed(tokens_bt)))

  def _embed_decoding(self, tokens_b: jax.Array, j_b: jax.Array) -> jax.Array:
    """`[B, d]`: each row's token at its decoder position `j_b` (eval mode, no dropout)."""
    if self.decoder_positions is None:
      return self.embed(tokens_b) + sinusoid_embedding(j_b, self.d_model)
    return self.decoder_positions.decode(self.embed(tokens_b)[:, None], j_b)[:, 0]

  def _stack(self, halves, x1_btd: jax.Array, x2_btd: jax.Array, valid_bt: jax.Array | None):
    """The two streams through `halves`: `(y1, y2, summed FF regularisers)`."""
    fns, params = zip(*(pure_half_residual(half) for half in halves))
    run = reversible_stack if self.reversible else sequential_stack
    return run(fns, list(params), x1_btd, x2_btd, self.stack_rngs(), valid_bt)

  def encode(self, inputs_bs: jax.Array):
    """`((stream 1, stream 2) [B, S, d] each, n_valid [B], regulariser)`; token 0 is padding.

    Both streams start at the embeddings. Trax's default join gives both streams
    `LN(Dense((y1 + y2) / 2))`; with `reversible_encoder` each keeps its own stream.
    """
    valid_bs = inputs_bs != PAD
    x_bsd = self._embed(inputs_bs, self.encoder_positions)
    y1_bsd, y2_bsd, loss = self._stack(self.encoder, x_bsd, x_bsd, valid_bs)
    if self.encoder_out is not None:
      h_bsd = (y1_bsd + y2_bsd) / 2
      y1_bsd = y2_bsd = self.encoder_norm(
          self.encoder_out(h_bsd.astype(self.dtype)).astype(h_bsd.dtype))
    return (y1_bsd, y2_bsd), jnp.sum(valid_bs, axis=1, dtype=jnp.int32), loss

  def logits(self, h_btd: jax.Array) -> jax.Array:
    """Float32 logits from compute-dtype matmuls (`layers.precision`): dense, or
    multiplicative (`loss_sparsity`, rounded to the compute dtype)."""
    h_btd = h_btd.astype(self.dtype)
    if self.sparse_out is not None:
      return self.sparse_out(h_btd).astype(jnp.float32) + self.b_out[...]
    return f32_einsum("...d,dv->...v", h_btd, self.w_out[...].astype(self.dtype)) + self.b_out[...]

  def __call__(self, inputs_bs: jax.Array, targets_bt: jax.Array):
    """`(logits [B, T, V], {"reg_loss"})`: teacher-forced prediction of `targets`."""
    enc_pair, n_valid_b, enc_loss = self.encode(inputs_bs)
    t = targets_bt.shape[1]
    dec_btd = self._embed(shift_right(targets_bt), self.decoder_positions)
    x1_bld, x2_bld = (concat_with_padding(enc_bsd, n_valid_b, dec_btd) for enc_bsd in enc_pair)
    y1_bld, y2_bld, dec_loss = self._stack(self.decoder, x1_bld, x2_bld, None)
    h_btd = strip_decoder(self.final_norm((y1_bld + y2_bld) / 2), n_valid_b, t)
    return self.logits(h_btd), {"reg_loss": enc_loss + dec_loss}

  def init_decoder_cache(self, batch: int, max_len: int) -> list:
    """One cache per decoder sublayer for `max_len` concatenated positions."""
    return [half.init_cache(batch, max_len, self.dtype) for half in self.decoder]

  def decode_position(self, x_b1d: jax.Array, caches: list, position: jax.Array,
                      x2_b1d: jax.Array | None = None):
    """`(logits [B, 1, V], caches)` of the concatenated sequence's position `position`, whose
    input vectors are `x_b1d` (both streams, or the first when `x2_b1d` is given): the
    decoder's sublayers one token at a time (no reversal)."""
    x1_b1d, x2_b1d = x_b1d, x_b1d if x2_b1d is None else x2_b1d
    new_caches = []
    for half, cache in zip(self.decoder, caches):
      y_b1d, cache = half.decode(x2_b1d, cache, position)
      x1_b1d, x2_b1d = x2_b1d, x1_b1d + y_b1d
      new_caches.append(cache)
    return self.logits(self.final_norm((x1_b1d + x2_b1d) / 2)), new_caches

  def greedy_decode(self, inputs_bs: jax.Array, max_target_len: int) -> jax.Array:
    """Greedy answers `[B, max_target_len]` (int32; call in eval mode).

    Position p of the concatenation is fed the encoder's output while `p < n_b` and the
    previous answer token (PAD at the start) after it, so every row advances one position
    per step although rows' encoder lengths differ; position `n_b + j` predicts token j.
    """
    enc_pair, n_valid_b, _ = self.encode(inputs_bs)
    b, s, _ = enc_pair[0].shape
    caches = self.init_decoder_cache(b, s + max_target_len)

    def step(carry, p):
      caches, prev_b, out_bt = carry
      j_b = p - n_valid_b  # The decoder index at this position; < 0 inside the encoder.
      dec_bd = self._embed_decoding(prev_b, jnp.maximum(j_b, 0))
      x1_bd, x2_bd = (
          jnp.where((p < n_valid_b)[:, None],
                    jax.lax.dynamic_index_in_dim(enc_bsd, jnp.minimum(p, s - 1), 1,
                                                 keepdims=False),
                    dec_bd.astype(enc_bsd.dtype))
          for enc_bsd in enc_pair)
      logits_b1v, caches = self.decode_position(x1_bd[:, None], caches, p, x2_bd[:, None])
      next_b = jnp.argmax(logits_b1v[:, 0], axis=-1).astype(jnp.int32)
      writing_b = (j_b >= 0) & (j_b < max_target_len)
      out_bt = jnp.where(writing_b[:, None] & (jnp.arange(max_target_len) == j_b[:, None]),
                         next_b[:, None], out_bt)
      prev_b = jnp.where(j_b >= 0, next_b, PAD)
      return (caches, prev_b, out_bt), None

    init = (caches, jnp.full((b,), PAD, jnp.int32), jnp.full((b, max_target_len), PAD, jnp.int32))
    (_, _, out_bt), _ = jax.lax.scan(step, init, jnp.arange(s + max_target_len))
    return out_bt
