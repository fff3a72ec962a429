"""LSH self-attention of Terraformer (Scaling Transformers Sec. 4.1; Reformer; Trax 1.4).

Terraformer attends over long inputs (arXiv articles of 16k tokens) with the Reformer's
locality-sensitive-hashing attention: each head hashes its shared query/key vectors into
buckets, sorts the tokens by bucket, cuts the sorted sequence into chunks and lets each
chunk attend only to itself and its neighbours, so a token sees `n_hashes * chunk_len *
(n_chunks_before + 1 + n_chunks_after)` keys instead of T. Sec. 4.2: the buckets are
discrete choices, so a reversible network stores them in the forward pass and replays them
(`buckets=`) when it recomputes the layer backward.

What Trax 1.4 does (`trax/layers/research/efficient_attention.py`), and what we do:

- Projections (`LSHSelfAttention.create_weights_unbatched`, `_share_qk = True`): one shared
  query/key projection `w_q`, a value projection and an output projection per head, no
  biases by default. Ours: `[d_model, H, Dh]` each, `Dh = d_model / H`, and `[H, Dh,
  d_model]` out, with the depth-scaled init of our other attention layers (Trax:
  Glorot-uniform per head over the total width).
- Sparse QKV (`_ProjectAndSplitHeads(weights_format='sparse', num_weights=3)`, used by
  `PureLSHSelfAttentionWrapper`): one `FactoredDense` shared by Q, K and V, then Q and K
  from their own `LocallyConvDense` (3 modules x 3 tokens), V from a 1 x 3 one, Q and K
  averaged into the shared QK (`QKAvg`: `(q + k) / 2`), no output dense. Ours reuses
  `MultiplicativeDense` (with bias) and `CausalModuleConv` as `SparseQKVAttention` does; the
  convolutions are causal, so this option needs `causal=True`.
- Scores (`attend` with `share_qk`): keys are `length_normalized(qk) / sqrt(Dh)`, where
  `length_normalized(x) = x / sqrt(mean(x^2) + 1e-6)`; queries are not scaled. So a score
  is `q . k / |k|` up to the epsilon.
- Hashing (`hash_vecs`, `LSHSelfAttention.hash_vectors`): on the raw shared QK (not
  normalised), rotations `R ~ N(0, 1)` of shape `[Dh, n_hashes, n_buckets / 2]` in float32,
  bucket `argmax([x R; -x R])` per round (`n_buckets` must be even). With a padding mask,
  padding tokens go to an extra bucket `n_buckets`, and round r's buckets are offset by
  `r * (n_buckets + 1)` (`r * n_buckets` without a mask). Ours always uses the extra bucket
  (for `valid_bt` padding and the internal length padding below) and the `n_buckets + 1`
  stride; the sorted order is the same either way.
- Rotations (`create_state_unbatched`, `forward_unbatched`): one hash RNG per example and
  head, split on every forward call, so training and evaluation draw new rotations each
  call; in 'predict' mode the RNG is never split, so decoding hashes with fixed rotations.
  Ours: rotations `[B, H, Dh, n_hashes, n_buckets / 2]` (per example and head) drawn per
  call from the layer's `routing` stream (the trainer reseeds it every step), or given
  (`rotations=`); `init_cache` stores them, so decoding and the full forward can share them.
- Sort (`forward_unbatched`): key `T * bucket + t` over all `n_hashes * T` (round, token)
  pairs, so the rounds are concatenated, each sorted by bucket and then by position.
- Chunks (`attend`, `look_adjacent`): the concatenated sorted sequence is cut into chunks of
  `chunk_len`; chunk k attends to chunks `k - n_chunks_before .. k + n_chunks_after`
  *cyclically* over the whole concatenation, so a round's first chunk sees the last chunk of
  the previous round (round 0 that of the last round). A key may thus appear twice in a
  window (once per round); Trax does not correct for duplicates, nor do we.
- Masks (`mask_self_attention`), subtracted from the scores rather than set: `1e9` where the
  key's position is after the query's (causal), `1e5` where it is the query's own token (a
  token attends to itself only when nothing else is visible), `1e9` for padding keys. Trax
  negates the 0-indexed position to mark padding and adds 1 afterwards, so padding at
  positions 0 and 1 escapes its mask; we mask every padding key.
- Softmax and dropout (`attend`): the log-sum-exp of each query's masked scores is kept,
  the probabilities `exp(scores - lse)` (ours: normalised by their sum, see
  `softmax_and_lse`) are dropped out with a keep mask of shape
  `[chunk_len, window]` shared by all chunks, and (one RNG in `forward_and_or_backward`) by
  all examples and heads, scaled by `1 / keep`. Ours: `nnx.Dropout` broadcast over batch,
  heads and chunks, from the `dropout` stream.
- Rounds (`forward_unbatched`): un-sorted, the `n_hashes` outputs of a token are averaged
  with weights `softmax_r(lse_r)`. Heads are summed after the output projection. Trax's
  `output_dropout` (`apply_broadcasted_dropout`: one `[d_model]` mask for all examples,
  heads and positions) is left to the model (`models.terraformer_blocks`).
- Length: Trax reshapes into chunks, so T must be a multiple of `chunk_len` (its 'predict'
  prefill pads). Ours pads internally with padding tokens (extra bucket, masked keys), so
  any T works and a prefix of any length has a well-defined output.
- Decoding (`_incremental_forward_unbatched`): Trax does *not* reproduce its full forward:
  it attends, in one softmax without the per-round combination, to the
  `n_hashes * chunk_len * (1 + n_chunks_before)` most recent cached tokens, preferring
  those that share a bucket with the query in any round. Ours is prefix-consistent instead:
  the output at position t equals the full forward (same rotations, no dropout) on
  `x[:, :t + 1]` at its last position (see `LSHSelfAttention.decode`). It need not equal the
  full forward on a longer sequence at t: causal masking hides later tokens' keys, but those
  tokens still take sorted slots and so move the chunk boundaries (true of Trax as well).

Summarisation config (`scientific_papers_terraformer.gin`): 2 hashes, 128 buckets, chunk
128, one chunk before, attention dropout 0.2; the encoder also one chunk after.
"""

import math

import jax
import jax.numpy as jnp
from flax import nnx

from sparse_jax import validation
from sparse_jax.layers import initializers
from sparse_jax.layers.multiplicative_dense import MultiplicativeDense
from sparse_jax.layers.precision import f32_einsum
from sparse_jax.layers.sparse_qkv_attention import CausalModuleConv

QKV_KINDS = ("dense", "sparse")
MASKED = 1e9  # Subtracted from causally masked and padding keys' scores (Trax).
SELF = 1e5  # Subtracted from a query's score with its own token (Trax).


def compute_dtype(dtype) -> jnp.dtype:
  """Scores, log-sum-exps and round weights: the input dtype, at least float32."""
  return jnp.promote_types(dtype, jnp.float32)


def normalized_keys(qk: jax.Array) -> jax.Array:
  """Trax's shared-QK keys `qk / sqrt(mean(qk^2) + 1e-6) / sqrt(Dh)`, in `compute_dtype`."""
  qk = qk.astype(compute_dtype(qk.dtype))
  scale = jax.lax.rsqrt(jnp.mean(jnp.square(qk), axis=-1, keepdims=True) + 1e-6)
  return qk * scale / math.sqrt(qk.shape[-1])


def rotation_buckets(qk_bthc: jax.Array, rotations_bhcnr: jax.Array) -> jax.Array:
  """Bucket `argmax([x R; -x R])` of every token, head and round, `[B, H, N, T]` int32.

  Rotations `[B, H, Dh, N, n_buckets / 2]` (per example, head and round); float32 as Trax.
  """
  rotated_bhntr = jnp.einsum("bthc,bhcnr->bhntr", qk_bthc.astype(jnp.float32),
                             rotations_bhcnr.astype(jnp.float32))
  both_bhntr = jnp.concatenate([rotated_bhntr, -rotated_bhntr], axis=-1)
  return jnp.argmax(both_bhntr, axis=-1).astype(jnp.int32)


def round_offsets(n_hashes: int, n_buckets: int) -> jax.Array:
  """`[N]`: round r's buckets start at `r * (n_buckets + 1)` (the `+ 1`: padding bucket)."""
  return jnp.arange(n_hashes, dtype=jnp.int32) * (n_buckets + 1)


def hash_buckets(qk_bthc: jax.Array, rotations_bhcnr: jax.Array, valid_bt: jax.Array,
                 n_buckets: int) -> jax.Array:
  """`[B, H, N, T]` int32 buckets with round offsets; padding tokens in bucket `n_buckets`."""
  buckets_bhnt = rotation_buckets(qk_bthc, rotations_bhcnr)
  buckets_bhnt = jnp.where(valid_bt[:, None, None, :], buckets_bhnt, n_buckets)
  return buckets_bhnt + round_offsets(buckets_bhnt.shape[2], n_buckets)[:, None]


def mask_penalty(q_pos: jax.Array, k_pos: jax.Array, k_valid: jax.Array, causal: bool,
                 dtype) -> jax.Array:
  """What Trax's `mask_self_attention` subtracts from a score (broadcast shapes): `MASKED`
  for a later key (causal) or a padding key, `SELF` for the query's own token."""
  penalty = (SELF * (q_pos == k_pos).astype(dtype)
             + MASKED * jnp.logical_not(k_valid).astype(dtype))
  if causal:
    penalty = penalty + MASKED * (k_pos > q_pos).astype(dtype)
  return penalty


def softmax_and_lse(scores: jax.Array) -> tuple[jax.Array, jax.Array]:
  """Softmax over the last axis and the log-sum-exp.

  Normalised by the sum (as `jax.nn.softmax`), not as Trax's `exp(scores - lse)`: when
  every visible score carries the 1e5 self penalty, float32 holds `lse` only to ~4e-3 and
  Trax's probabilities then sum to 1 +- 0.5%; here they sum to 1.
  """
  top = jax.lax.stop_gradient(jnp.max(scores, axis=-1, keepdims=True))
  exp = jnp.exp(scores - top)
  total = jnp.sum(exp, axis=-1, keepdims=True)
  return exp / total, (top + jnp.log(total))[..., 0]


def look_adjacent(x_bhk: jax.Array, n_before: int, n_after: int) -> jax.Array:
  """`[B, H, K, c, ...] -> [B, H, K, (n_before + 1 + n_after) c, ...]`: chunk k followed by
  its neighbours `k - n_before .. k + n_after`, cyclically over the K chunks (Trax)."""
  return jnp.concatenate([jnp.roll(x_bhk, -i, axis=2) for i in range(-n_before, n_after + 1)],
                         axis=3)


def combine_rounds(o_bhn: jax.Array, lse_bhn: jax.Array) -> jax.Array:
  """`sum_r softmax_r(lse_r) o_r` over the round axis 2: `o [B, H, N, ..., Dh]`, lse
  `[B, H, N, ...]`; in `compute_dtype`."""
  weights = jax.nn.softmax(lse_bhn, axis=2)
  return jnp.sum(o_bhn.astype(weights.dtype) * weights[..., None], axis=2)


def sorted_order(buckets_bhnt: jax.Array) -> jax.Array:
  """`[B, H, N T]`: the flat index `r T + t` (round, position) held by each sorted slot.

  The round offsets keep the rounds apart and in order, and the stable sort keeps positions
  ascending within a bucket: slots `r T .. r T + T - 1` hold round r sorted by (bucket,
  position).
  """
  b, h, n, t = buckets_bhnt.shape
  return jnp.argsort(buckets_bhnt.reshape(b, h, n * t), axis=-1, stable=True)


def chunked_lsh_attention(qk_bhtc: jax.Array, v_bhtc: jax.Array, buckets_bhnt: jax.Array,
                          valid_bt: jax.Array, *, chunk_len: int, n_chunks_before: int,
                          n_chunks_after: int, causal: bool,
                          dropout: nnx.Dropout) -> jax.Array:
  """The multi-round chunked attention of Trax's `forward_unbatched`, `[B, H, T, Dh]`.

  T must be a multiple of `chunk_len` here (`LSHSelfAttention` pads). Returned in
  `compute_dtype`.
  """
  b, h, n, t = buckets_bhnt.shape
  c, dtype = qk_bhtc.shape[-1], qk_bhtc.dtype
  order_bhl = jax.lax.stop_gradient(sorted_order(buckets_bhnt))
  pos_bhl = order_bhl % t
  sqk_bhlc = jnp.take_along_axis(qk_bhtc, pos_bhl[..., None], axis=2)
  sv_bhlc = jnp.take_along_axis(v_bhtc, pos_bhl[..., None], axis=2)
  svalid_bhl = jnp.take_along_axis(jnp.broadcast_to(valid_bt[:, None], (b, h, t)), pos_bhl,
                                   axis=-1)

  def chunks(a_bhl):
    return a_bhl.reshape(b, h, -1, chunk_len, *a_bhl.shape[3:])

  def adjacent(a_bhl):
    return look_adjacent(chunks(a_bhl), n_chunks_before, n_chunks_after)

  q_bhkqc = chunks(sqk_bhlc)
  k_bhkwc = adjacent(normalized_keys(sqk_bhlc).astype(dtype))
  scores_bhkqw = f32_einsum("bhkqc,bhkwc->bhkqw", q_bhkqc, k_bhkwc)
  scores_bhkqw = scores_bhkqw - mask_penalty(
      chunks(pos_bhl)[..., :, None], adjacent(pos_bhl)[..., None, :],
      adjacent(svalid_bhl)[..., None, :], causal, scores_bhkqw.dtype)
  probs_bhkqw, lse_bhkq = softmax_and_lse(scores_bhkqw)
  probs_bhkqw = dropout(probs_bhkqw).astype(dtype)
  so_bhlc = jnp.einsum("bhkqw,bhkwc->bhkqc", probs_bhkqw, adjacent(sv_bhlc)).reshape(
      b, h, n * t, c)
  undo_bhl = jax.lax.stop_gradient(jnp.argsort(order_bhl, axis=-1))
  o_bhntc = jnp.take_along_axis(so_bhlc, undo_bhl[..., None], axis=2).reshape(b, h, n, t, c)
  lse_bhnt = jnp.take_along_axis(lse_bhkq.reshape(b, h, n * t), undo_bhl, axis=-1)
  return combine_rounds(o_bhntc, lse_bhnt.reshape(b, h, n, t))


def prefix_window(buckets_bhnm: jax.Array, index_bhnm: jax.Array, counts_bhnb: jax.Array,
                  position: jax.Array, *, chunk_len: int, n_chunks_before: int,
                  n_chunks_after: int) -> jax.Array:
  """Positions `[B, H, N, W]` of the keys that the newest token (at `position`) sees in each
  round of the full forward on the prefix `0..position`; -1 marks a padding key.

  Cache rows `m` beyond `position` are unwritten. A prefix token's slot in the sorted
  order of its round is (prefix tokens in lower buckets) + (its index within its bucket), so
  the ranks come from the per-bucket counts without a sort; rounds are concatenated with the
  prefix padded to a multiple of `chunk_len`, so round r starts at slot `r * padded`.
  Scattering position by slot and reading the query's chunk window (cyclic, as
  `look_adjacent`) gives its keys: O(N (n_buckets + m)) integer work, O(N W) gathered.
  """
  b, h, n, m = buckets_bhnm.shape
  padded = (position // chunk_len + 1) * chunk_len
  m_padded = -(-m // chunk_len) * chunk_len
  lower_bhnb = jnp.cumsum(counts_bhnb, axis=-1) - counts_bhnb
  rank_bhnm = jnp.take_along_axis(lower_bhnb, buckets_bhnm, axis=-1) + index_bhnm
  slot_bhnm = jnp.arange(n, dtype=jnp.int32)[:, None] * padded + rank_bhnm
  own_bhn = jax.lax.dynamic_index_in_dim(slot_bhnm, position, axis=3, keepdims=False)
  positions_m = jnp.arange(m, dtype=jnp.int32)
  slot_bhnm = jnp.where(positions_m <= position, slot_bhnm, n * m_padded)  # dropped below
  token_bhs = jnp.full((b, h, n * m_padded), -1, jnp.int32).at[
      jnp.arange(b)[:, None, None, None], jnp.arange(h)[None, :, None, None], slot_bhnm].set(
          jnp.broadcast_to(positions_m, slot_bhnm.shape), mode="drop")
  width = chunk_len * (n_chunks_before + 1 + n_chunks_after)
  start_bhn = (own_bhn // chunk_len - n_chunks_before) * chunk_len
  window_bhnw = jnp.mod(start_bhn[..., None] + jnp.arange(width), n * padded)
  return jnp.take_along_axis(token_bhs, window_bhnw.reshape(b, h, n * width),
                             axis=-1).reshape(b, h, n, width)


def gather_rows(cache_bhmc: jax.Array, pos_bhnw: jax.Array) -> jax.Array:
  """Rows `[B, H, N, W, Dh]` of a `[B, H, max_len, Dh]` cache at positions (-1 reads row 0)."""
  b, h, n, w = pos_bhnw.shape
  flat_bhl = jnp.maximum(pos_bhnw, 0).reshape(b, h, n * w, 1)
  return jnp.take_along_axis(cache_bhmc, flat_bhl, axis=2).reshape(b, h, n, w, -1)


def padded_heads(x_bthc: jax.Array, pad: int) -> jax.Array:
  """`[B, T, H, Dh] -> [B, H, T + pad, Dh]`, zeros after the sequence."""
  return jnp.pad(x_bthc, ((0, 0), (0, pad), (0, 0), (0, 0))).transpose(0, 2, 1, 3)


def padded_buckets(buckets_bhnt: jax.Array, pad: int, n_buckets: int) -> jax.Array:
  """`[B, H, N, T + pad]`: the padding tokens in their round's padding bucket."""
  b, h, n, _ = buckets_bhnt.shape
  pad_bucket_n1 = round_offsets(n, n_buckets)[:, None] + n_buckets
  return jnp.concatenate([buckets_bhnt, jnp.broadcast_to(pad_bucket_n1, (b, h, n, pad))],
                         axis=-1)


def write_at(cache_array: jax.Array, new: jax.Array, position: jax.Array, axis: int):
  """`cache_array` with `new` (the array without `axis`) written at `position` on `axis`."""
  return jax.lax.dynamic_update_index_in_dim(cache_array, new.astype(cache_array.dtype),
                                             position, axis)


class DenseSharedQK(nnx.Module):
  """Shared QK and V `[d_model, H, Dh]`, output `[H, Dh, d_model]`, no biases (Trax)."""

  def __init__(self, d_model: int, n_heads: int, *, n_layers: int, rngs: nnx.Rngs):
    self.w_qk, self.w_v, self.w_o = initializers.head_projections(
        d_model, n_heads, d_model // n_heads, n_layers=n_layers, n_inputs=2, rngs=rngs)

  def __call__(self, x_btd: jax.Array) -> tuple[jax.Array, jax.Array]:
    """`[B, T, d_model]` -> shared qk, v `[B, T, H, Dh]`."""
    dtype = x_btd.dtype
    return (jnp.einsum("btd,dhc->bthc", x_btd, self.w_qk[...].astype(dtype)),
            jnp.einsum("btd,dhc->bthc", x_btd, self.w_v[...].astype(dtype)))

  def step(self, x_b1d: jax.Array, cache: dict) -> tuple[jax.Array, jax.Array, dict]:
    """One decoded token: qk, v `[B, 1, H, Dh]`; the cache passes through."""
    return (*self(x_b1d), cache)

  def init_cache(self, batch: int, dtype) -> dict[str, jax.Array]:
    return {}

  def out(self, out_bthc: jax.Array) -> jax.Array:
    """`[B, T, H, Dh] -> [B, T, d_model]` as one matmul over `H * Dh`."""
    b, t, h, c = out_bthc.shape
    return out_bthc.reshape(b, t, h * c) @ self.w_o[...].astype(out_bthc.dtype).reshape(h * c, -1)

  def flops_per_token(self) -> int:
    """Shared QK, V and output projections: `3 d_model H Dh` multiply-adds."""
    return 3 * self.w_qk.size  # `.size`, not `[...]`: also on abstract (eval_shape) layers.


class SparseSharedQK(nnx.Module):
  """Sparse QKV (Sec. 3.2) for LSH: a multiplicative layer, Q and K from their own 3 x 3
  convolutions averaged into the shared QK, V from a 3 x 1 one; no output layer."""

  def __init__(self, d_model: int, n_heads: int, n_modules: int, *, n_layers: int,
               rngs: nnx.Rngs):
    validation.require(d_model % n_modules == 0, "n_modules", f"a divisor of d_model={d_model}",
                       n_modules)
    self.n_heads, self.n_modules, self.module_size = n_heads, n_modules, d_model // n_modules
    self.mult = MultiplicativeDense(d_model, d_model, n_modules, use_bias=True, rngs=rngs)
    self.conv_q = CausalModuleConv(self.module_size, (3, 3), n_layers=n_layers, rngs=rngs)
    self.conv_k = CausalModuleConv(self.module_size, (3, 3), n_layers=n_layers, rngs=rngs)
    self.conv_v = CausalModuleConv(self.module_size, (3, 1), n_layers=n_layers, rngs=rngs)
    self.window = max(conv.f_len for conv in (self.conv_q, self.conv_k, self.conv_v)) - 1

  def to_heads(self, y_btsm: jax.Array) -> jax.Array:
    """`[B, T, S, M] -> [B, T, H, d_model / H]`."""
    return y_btsm.reshape(*y_btsm.shape[:2], self.n_heads, -1)

  def module_grid(self, x_btd: jax.Array) -> jax.Array:
    return self.mult(x_btd).reshape(*x_btd.shape[:-1], self.n_modules, self.module_size)

  def qkv(self, q_btsm: jax.Array, k_btsm: jax.Array, v_btsm: jax.Array):
    """Heads of `(q + k) / 2` (Trax's `QKAvg`) and of v."""
    return self.to_heads((q_btsm + k_btsm) / 2), self.to_heads(v_btsm)

  def __call__(self, x_btd: jax.Array) -> tuple[jax.Array, jax.Array]:
    y_btsm = self.module_grid(x_btd)
    return self.qkv(self.conv_q(y_btsm), self.conv_k(y_btsm), self.conv_v(y_btsm))

  def step(self, x_b1d: jax.Array, cache: dict) -> tuple[jax.Array, jax.Array, dict]:
    """One token from the cached `mult` window (as `SparseQKVAttention.decode`)."""
    window_bwsm = jnp.concatenate(
        [cache["mult"].astype(x_b1d.dtype), self.module_grid(x_b1d)], axis=1)
    qk, v = self.qkv(self.conv_q.last(window_bwsm), self.conv_k.last(window_bwsm),
                     self.conv_v.last(window_bwsm))
    return qk, v, {**cache, "mult": window_bwsm[:, 1:].astype(cache["mult"].dtype)}

  def init_cache(self, batch: int, dtype) -> dict[str, jax.Array]:
    """`mult`: the last `F_len - 1 = 2` outputs `[B, 2, S, M]` of the multiplicative layer."""
    return {"mult": jnp.zeros((batch, self.window, self.n_modules, self.module_size), dtype)}

  def out(self, out_bthc: jax.Array) -> jax.Array:
    return out_bthc.reshape(*out_bthc.shape[:2], -1)

  def flops_per_token(self) -> int:
    """The multiplicative layer and the three convolutions (as `SparseQKVAttention`)."""
    convs = (self.conv_q, self.conv_k, self.conv_v)
    return self.mult.flops_per_token() + self.n_modules * sum(c.kernel.size for c in convs)


class LSHSelfAttention(nnx.Module):
  """Multi-round LSH self-attention with shared QK; `y, buckets = attn(x)`.

  `qkv`: "dense" (`DenseSharedQK`) or "sparse" (`SparseSharedQK`, causal only; `n_modules`
  is its S, default `n_heads`). Randomness: rotations from the `routing` stream, attention
  dropout from `dropout`.
  """

  def __init__(self, d_model: int, n_heads: int, *, n_layers: int, n_hashes: int = 2,
               n_buckets: int = 128, chunk_len: int = 128, n_chunks_before: int = 1,
               n_chunks_after: int = 0, causal: bool = True, attn_dropout: float = 0.0,
               qkv: str = "dense", n_modules: int | None = None, rngs: nnx.Rngs):
    for name, value in (("d_model", d_model), ("n_heads", n_heads), ("n_hashes", n_hashes),
                        ("n_buckets", n_buckets), ("chunk_len", chunk_len)):
      validation.require_positive_int(value, name)
    validation.require(n_buckets % 2 == 0, "n_buckets", "even (buckets are argmax over "
                       "[xR; -xR])", n_buckets)
    validation.require(d_model % n_heads == 0, "n_heads", f"a divisor of d_model={d_model}",
                       n_heads)
    for name, value in (("n_chunks_before", n_chunks_before),
                        ("n_chunks_after", n_chunks_after)):
      validation.require(isinstance(value, int) and value >= 0, name,
                         "a non-negative integer", value)
    validation.require_probability(attn_dropout, "attn_dropout")
    validation.require_choice(qkv, "qkv", QKV_KINDS)
    validation.require(qkv == "dense" or causal, "qkv", "'dense' when causal=False (the "
                       "sparse QKV convolutions are causal)", qkv)
    validation.require(qkv == "sparse" or n_modules is None, "n_modules",
                       "None unless qkv='sparse'", n_modules)
    self.d_model, self.n_heads, self.head_dim = d_model, n_heads, d_model // n_heads
    self.n_hashes, self.n_buckets, self.chunk_len = n_hashes, n_buckets, chunk_len
    self.n_chunks_before, self.n_chunks_after, self.causal = n_chunks_before, n_chunks_after, causal
    if qkv == "dense":
      self.projections = DenseSharedQK(d_model, n_heads, n_layers=n_layers, rngs=rngs)
    else:
      self.projections = SparseSharedQK(d_model, n_heads, n_heads if n_modules is None
                                        else n_modules, n_layers=n_layers, rngs=rngs)
    self.attn_dropout = nnx.Dropout(attn_dropout, broadcast_dims=(0, 1, 2), rngs=rngs)
    self.hash_rngs = rngs["routing"].fork()

  def draw_rotations(self, batch: int) -> jax.Array:
    """Random rotations `[B, H, Dh, N, n_buckets / 2]` ~ N(0, 1) from the `routing` stream."""
    shape = (batch, self.n_heads, self.head_dim, self.n_hashes, self.n_buckets // 2)
    return jax.random.normal(self.hash_rngs(), shape, jnp.float32)

  def __call__(self, x_btd: jax.Array, *, valid_bt: jax.Array | None = None,
               buckets: jax.Array | None = None,
               rotations: jax.Array | None = None) -> tuple[jax.Array, jax.Array]:
    """`[B, T, d_model] -> ([B, T, d_model], buckets [B, H, N, T] int32)`.

    `valid_bt` (bool) marks the keys that may be attended (padding is False). `buckets`, if
    given, replaces hashing (a reversible network's replay): the output is then a function
    of `(x, buckets, dropout RNG)` alone. Otherwise tokens are hashed with `rotations`
    (`[B, H, Dh, N, n_buckets / 2]`, default: drawn now). Buckets carry round offsets
    (`r * (n_buckets + 1)`), padding in bucket `n_buckets` of its round. T need not be a
    multiple of `chunk_len`: the sequence is padded with masked tokens that sort last.
    """
    b, t, _ = x_btd.shape
    valid_bt = jnp.ones((b, t), bool) if valid_bt is None else valid_bt
    qk_bthc, v_bthc = self.projections(x_btd)
    if buckets is None:
      rotations = self.draw_rotations(b) if rotations is None else rotations
      buckets = hash_buckets(qk_bthc, rotations, valid_bt, self.n_buckets)
    validation.require(buckets.shape == (b, self.n_heads, self.n_hashes, t), "buckets",
                       f"of shape [B, H, N, T] = {(b, self.n_heads, self.n_hashes, t)}",
                       buckets.shape)
    buckets = jax.lax.stop_gradient(buckets)
    pad = -t % self.chunk_len
    out_bhtc = chunked_lsh_attention(
        padded_heads(qk_bthc, pad), padded_heads(v_bthc, pad),
        padded_buckets(buckets, pad, self.n_buckets), jnp.pad(valid_bt, ((0, 0), (0, pad))),
        chunk_len=self.chunk_len, n_chunks_before=self.n_chunks_before,
        n_chunks_after=self.n_chunks_after, causal=self.causal, dropout=self.attn_dropout)
    out_bthc = out_bhtc[:, :, :t].transpose(0, 2, 1, 3).astype(x_btd.dtype)
    return self.projections.out(out_bthc), buckets

  def init_cache(self, batch: int, max_len: int, dtype, *,
                 rotations: jax.Array | None = None) -> dict[str, jax.Array]:
    """Decoding state (causal only):

    - `k`, `v` `[B, H, max_len, Dh]` (`dtype`): normalised keys and values by position;
    - `buckets`, `index` `[B, H, N, max_len]` int32: each token's bucket within its round
      (no offset) and how many earlier tokens share it;
    - `counts` `[B, H, N, n_buckets]` int32: tokens so far per bucket;
    - `rotations` `[B, H, Dh, N, n_buckets / 2]` float32: given, or drawn now from the
      `routing` stream; pass the same to `__call__(rotations=)` for the equivalent forward;
    - sparse QKV only: `mult` `[B, 2, S, M]`, the convolutions' window.
    """
    validation.require(self.causal, "causal", "True to decode one token at a time",
                       self.causal)
    shape = (batch, self.n_heads, self.n_hashes)
    return {
        "k": jnp.zeros((batch, self.n_heads, max_len, self.head_dim), dtype),
        "v": jnp.zeros((batch, self.n_heads, max_len, self.head_dim), dtype),
        "buckets": jnp.zeros((*shape, max_len), jnp.int32),
        "index": jnp.zeros((*shape, max_len), jnp.int32),
        "counts": jnp.zeros((*shape, self.n_buckets), jnp.int32),
        "rotations": self.draw_rotations(batch) if rotations is None else rotations,
        **self.projections.init_cache(batch, dtype),
    }

  def record_token(self, qk_b1hc: jax.Array, v_b1hc: jax.Array, cache: dict,
                   position: jax.Array) -> dict:
    """Hashes the new token, gives it the next index in its buckets, stores its key and
    value at `position`."""
    buckets_bhn = rotation_buckets(qk_b1hc, cache["rotations"])[..., 0]
    index_bhn = jnp.take_along_axis(cache["counts"], buckets_bhn[..., None], axis=-1)[..., 0]
    counts = cache["counts"] + jax.nn.one_hot(buckets_bhn, self.n_buckets, dtype=jnp.int32)
    return {**cache, "counts": counts,
            "buckets": write_at(cache["buckets"], buckets_bhn, position, axis=3),
            "index": write_at(cache["index"], index_bhn, position, axis=3),
            "k": write_at(cache["k"], normalized_keys(qk_b1hc[:, 0]), position, axis=2),
            "v": write_at(cache["v"], v_b1hc[:, 0], position, axis=2)}

  def decode(self, x_b1d: jax.Array, cache: dict, position: jax.Array) -> tuple[jax.Array, dict]:
    """One token at `position` (int32 scalar, < max_len); calls come at positions 0, 1, 2,
    ... in order.

    Equals the full forward with the cache's rotations (and no dropout) on the prefix
    `x[:, :position + 1]`, at its last position: the same `N W` keys, `W = chunk_len *
    (n_chunks_before + 1 + n_chunks_after)`, found by `prefix_window` without sorting.
    Cost per token: the projections, hashing (`H Dh N n_buckets / 2`), O(N (n_buckets +
    max_len)) integer work per head, and attention over `N W` keys.
    """
    qk_b1hc, v_b1hc, cache = self.projections.step(x_b1d, cache)
    cache = self.record_token(qk_b1hc, v_b1hc, cache, position)
    pos_bhnw = prefix_window(cache["buckets"], cache["index"], cache["counts"], position,
                             chunk_len=self.chunk_len, n_chunks_before=self.n_chunks_before,
                             n_chunks_after=self.n_chunks_after)
    dtype = x_b1d.dtype
    scores_bhnw = jnp.einsum("bhc,bhnwc->bhnw", qk_b1hc[:, 0],
                             gather_rows(cache["k"], pos_bhnw).astype(dtype),
                             preferred_element_type=compute_dtype(dtype))
    scores_bhnw = scores_bhnw - mask_penalty(position, pos_bhnw, pos_bhnw >= 0, self.causal,
                                             scores_bhnw.dtype)
    probs_bhnw, lse_bhn = softmax_and_lse(scores_bhnw)
    probs_bhnw = self.attn_dropout(probs_bhnw).astype(dtype)
    o_bhnc = jnp.einsum("bhnw,bhnwc->bhnc", probs_bhnw,
                        gather_rows(cache["v"], pos_bhnw).astype(dtype))
    out_b1hc = combine_rounds(o_bhnc, lse_bhn)[:, None].astype(dtype)
    return self.projections.out(out_b1hc), cache

  def flops_per_token(self) -> int:
    """Multiply-adds of the projections for one token (dense: shared QK, V, output; sparse:
    the multiplicative layer and three convolutions). Excludes hashing (`H Dh N
    n_buckets / 2`) and the attention itself (`2 H Dh` per visible key, `N W` keys)."""
    return self.projections.flops_per_token()
