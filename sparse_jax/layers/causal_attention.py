"""Standard causal multi-head self-attention: the dense baseline of Scaling Transformers.

Sec. 1 of the paper counts a decoded token's attention cost as four dense `d_model x d_model`
matrices (Q, K, V and output); Sec. 3.2 replaces them with the sparse QKV layer. This module is
the dense side of that comparison:

    q, k, v = x W_q (+ b_q), x W_k (+ b_k), x W_v (+ b_v)    (per head; q, k optionally rotary)
    out = concat_h softmax(q k^T / sqrt(Dh) + causal mask) v,   y = out W_o (+ b_o).

The biases (`use_bias`, off by default) are those of Trax's `tl.CausalAttention`, whose four
projections are `tl.Dense` layers (bias init N(0, 1e-6^2) there, zeros here); rotary positions
rotate the biased q and k.

Decoding keeps every past key and value in a cache `[B, H, max_len, Dh]` (head-major, as the
per-head contractions of one query read it: a position-major cache made XLA:CPU copy it into
that order on every token, 1.0 of 1.2 ms at the 17B shape), so one token costs the four
projections plus one attention row. The helpers `attend`, `init_kv_cache` and
`attend_cached` are shared with the sparse QKV attention, which differs only in its projections.

Training and prefill run the attention core of `core` (`model.attention_core`, see
`layers.cudnn_attention`): "xla" (`attend`, the scores in memory) or "cudnn" (fused, the
scores never in memory; no attention dropout); "auto" is "xla" until the cuDNN path has run
on a GPU. `attend_causal` dispatches; SwitchHead's RoPE attention shares it.
"""

import math

import jax
import jax.numpy as jnp
from flax import nnx

from sparse_jax import parallel
from sparse_jax.layers import cudnn_attention, initializers, sequence_parallel
from sparse_jax.layers.precision import f32_einsum
from sparse_jax.layers.rotary import apply_partial_rotary, rotated_channels


def causal_mask(t: int) -> jax.Array:
  """`[T, T]` bool: query i sees keys j <= i."""
  return jnp.tril(jnp.ones((t, t), dtype=bool))


def attend(q_bthc: jax.Array, k_bkhc: jax.Array, v_bkhc: jax.Array, mask_tk: jax.Array,
           dropout: nnx.Dropout) -> jax.Array:
  """Scaled dot-product attention of T queries over K keys where `mask_tk` allows; `[B,T,H,C]`.

  Scores and softmax are float32 whatever the input dtype; dropout acts on the probabilities.
  """
  dtype = q_bthc.dtype
  scores_bhtk = f32_einsum("bthc,bkhc->bhtk", q_bthc, k_bkhc)
  scores_bhtk = jnp.where(mask_tk, scores_bhtk / math.sqrt(q_bthc.shape[-1]), -1e30)
  probs_bhtk = dropout(jax.nn.softmax(scores_bhtk, axis=-1)).astype(dtype)
  return jnp.einsum("bhtk,bkhc->bthc", probs_bhtk, v_bkhc.astype(dtype))


def attend_causal(q_bthc: jax.Array, k_bthc: jax.Array, v_bthc: jax.Array,
                  dropout: nnx.Dropout, core: str) -> jax.Array:
  """Causal self-attention of a sequence, `[B, T, H, Dh]`, on the core `core`
  (`cudnn_attention.CORES`): cuDNN's fused kernels for "cudnn", else `attend`."""
  if core == "cudnn":
    return cudnn_attention.attend_cudnn(q_bthc, k_bthc, v_bthc)
  return attend(q_bthc, k_bthc, v_bthc, causal_mask(q_bthc.shape[1]), dropout)


def attend_one(q_b1hc: jax.Array, k_bhkc: jax.Array, v_bhkc: jax.Array, k_bh1c: jax.Array,
               v_bh1c: jax.Array, position: jax.Array, dropout: nnx.Dropout) -> jax.Array:
  """`attend` for one query per row (decoding) over the head-major cache rows `< position`
  and the new key and value, which belong at `position`: what `attend` computes on the
  cache after the new row is written (the same scores, softmax, dropout mask shape
  `[B, H, 1, K]` and result dtype), without reading that updated cache, so XLA can write
  the row in place (a cache read after its update made XLA:CPU copy it twice per token).
  The length-1 query axis is dropped from the contractions: XLA:CPU runs `bthc,bkhc` at
  T = 1 as a slow degenerate batched dot."""
  dtype, n_keys = q_b1hc.dtype, k_bhkc.shape[2]
  q_bhc = q_b1hc[:, 0]
  keys_k = jnp.arange(n_keys)
  scores_bhk = jnp.where(keys_k == position, f32_einsum("bhc,bhkc->bhk", q_bhc, k_bh1c),
                         f32_einsum("bhc,bhkc->bhk", q_bhc, k_bhkc))
  scores_bhk = jnp.where(keys_k <= position, scores_bhk / math.sqrt(q_b1hc.shape[-1]), -1e30)
  probs_bhk = dropout(jax.nn.softmax(scores_bhk, axis=-1)[:, :, None, :])[:, :, 0, :]
  probs_bhk = probs_bhk.astype(dtype)
  new_bh1 = jax.lax.dynamic_slice_in_dim(probs_bhk, position, 1, axis=2)
  out_bhc = (jnp.einsum("bhk,bhkc->bhc", jnp.where(keys_k == position, 0, probs_bhk),
                        v_bhkc.astype(dtype))
             + jnp.einsum("bhk,bhkc->bhc", new_bh1, v_bh1c.astype(dtype)))
  return out_bhc[:, None]


def _project_heads(x_btd: jax.Array, *w_dhc: jax.Array) -> tuple[jax.Array, ...]:
  """`x [B, T, d]` projected into heads by each `w [d, H, Dh]`: `[B, T, H, Dh]` each."""
  return tuple(jnp.einsum("btd,dhc->bthc", x_btd, w) for w in w_dhc)


def _project_out(out_bthc: jax.Array, w_hcd: jax.Array) -> jax.Array:
  """`[B, T, H, Dh] x [H, Dh, d] -> [B, T, d]` as one matmul over `H * Dh`."""
  b, t, h, c = out_bthc.shape
  return out_bthc.reshape(b, t, h * c) @ w_hcd.reshape(h * c, -1)


KV_CACHE_AXES = ("batch", "heads", None, None)  # Of `[B, H, max_len, Dh]` (`sparse_jax.parallel`).


def init_kv_cache(batch: int, max_len: int, n_heads: int, head_dim: int,
                  dtype) -> dict[str, jax.Array]:
  """Zero key and value caches, each `[B, H, max_len, Dh]` (head-major), split by head over
  `mesh.tensor` under a mesh, as the heads that write them are."""
  shape = (batch, n_heads, max_len, head_dim)
  zeros = lambda: parallel.constrain(jnp.zeros(shape, dtype), KV_CACHE_AXES)
  return {"k": zeros(), "v": zeros()}


def index_after(index: jax.Array, x: jax.Array, size: int) -> jax.Array:
  """`index` (in `[0, size)`), computed from `x` so that it is ready only after `x` is.

  A cache row written in place while the same step reads the cache: XLA:CPU's copy insertion
  orders operations by their data dependencies only, so with the write independent of the
  reads it copied the whole cache twice per step (4 x 4.75 MB per token at the 17B shape).
  Making the write's index depend on the read's result orders the write last, and the copies
  go. `x > inf` is false for every float, NaN included, so the value is always `index`.
  """
  index = jnp.asarray(index)
  not_after = (x.reshape(-1)[0] > jnp.inf).astype(index.dtype)
  return jnp.minimum(index, size + not_after)


def attend_cached(q_b1hc: jax.Array, k_b1hc: jax.Array, v_b1hc: jax.Array, cache: dict,
                  position: jax.Array, dropout: nnx.Dropout) -> tuple[jax.Array, dict]:
  """Writes the new key and value at `position`, then attends to cache rows `<= position`.

  Other entries of `cache` pass through unchanged. The attention reads the cache before the
  write (`attend_one`), and the write waits for its result (`index_after`), so that a donated
  cache is updated in place.
  """
  k_bh1c = jnp.swapaxes(k_b1hc, 1, 2).astype(cache["k"].dtype)
  v_bh1c = jnp.swapaxes(v_b1hc, 1, 2).astype(cache["v"].dtype)
  out_b1hc = attend_one(q_b1hc, cache["k"], cache["v"], k_bh1c, v_bh1c, position, dropout)
  start = (0, 0, index_after(position, out_b1hc, cache["k"].shape[2]), 0)
  return out_b1hc, {**cache, "k": jax.lax.dynamic_update_slice(cache["k"], k_bh1c, start),
                    "v": jax.lax.dynamic_update_slice(cache["v"], v_bh1c, start)}


def check_rotary_dim(rotary: bool, head_dim: int) -> None:
  """Rotary rotates channel pairs, so it needs an even head dimension."""
  if rotary and head_dim % 2:
    raise ValueError(f"rotary position embedding needs an even head_dim, got {head_dim}.")


class CausalSelfAttention(nnx.Module):
  """Dense Q, K, V `[d_model, H, Dh]` and output `[H, Dh, d_model]`; causal; KV-cache decoding.

  `use_bias`: zero-initialised biases `b_q, b_k, b_v [H, Dh]` and `b_o [d_model]`.
  `rotary_fraction` < 1 rotates only the first `rotated_channels(fraction, Dh)` channels of
  q and k (the MoEUT authors' dense RoPE baselines: half). `core`: the attention core of
  `__call__` (`attend_causal`).
  """

  RESIDUAL_OUTPUTS = ("w_o",)  # Its projection into the residual stream.

  def __init__(self, d_model: int, n_heads: int, head_dim: int, *, n_layers: int,
               attn_dropout: float = 0.0, rotary: bool = True, use_bias: bool = False,
               rotary_fraction: float = 1.0, core: str = "auto", rngs: nnx.Rngs):
    cudnn_attention.check_core(core, head_dim, attn_dropout)
    if rotary_fraction == 1.0:
      check_rotary_dim(rotary, head_dim)
    self.n_rotate = rotated_channels(rotary_fraction, head_dim) if rotary else 0
    if rotary and self.n_rotate < 2:
      raise ValueError(f"rotary_fraction={rotary_fraction} rotates {self.n_rotate} of the "
                       f"head_dim={head_dim} channels; it must rotate at least 2.")
    self.d_model, self.n_heads, self.head_dim, self.rotary = d_model, n_heads, head_dim, rotary
    self.core = core
    self.w_q, self.w_k, self.w_v, self.w_o = initializers.head_projections(
        d_model, n_heads, head_dim, n_layers=n_layers, n_inputs=3, rngs=rngs)
    if use_bias:
      self.b_q, self.b_k, self.b_v = (
          nnx.Param(jnp.zeros((n_heads, head_dim)), logical_axes=("heads", "head_dim"))
          for _ in range(3))
      self.b_o = nnx.Param(jnp.zeros((d_model,)), logical_axes=("embed",))
    else:
      self.b_q = self.b_k = self.b_v = self.b_o = None
    self.attn_dropout = nnx.Dropout(attn_dropout, rngs=rngs)

  def project_qkv(self, x_btd: jax.Array, positions_t: jax.Array):
    """`[B, T, d_model]` at absolute positions `[T]` -> q, k, v `[B, T, H, Dh]` (q, k rotated)."""
    dtype = x_btd.dtype
    weights = [(w[...].astype(dtype), initializers.HEAD_IN_AXES)
               for w in (self.w_q, self.w_k, self.w_v)]
    q_bthc, k_bthc, v_bthc = sequence_parallel.column_parallel(
        _project_heads, [x_btd], weights, [sequence_parallel.HEADS_AXES] * 3)
    if self.b_q is not None:
      q_bthc, k_bthc, v_bthc = (y_bthc + b[...].astype(dtype) for y_bthc, b in
                                zip((q_bthc, k_bthc, v_bthc), (self.b_q, self.b_k, self.b_v)))
    if self.rotary:
      q_bthc, k_bthc = (apply_partial_rotary(q_bthc, positions_t, self.n_rotate),
                        apply_partial_rotary(k_bthc, positions_t, self.n_rotate))
    return q_bthc, k_bthc, v_bthc

  def project_out(self, out_bthc: jax.Array) -> jax.Array:
    """`[B, T, H, Dh] -> [B, T, d_model]` as one matmul over `H * Dh`: XLA:CPU runs the
    two-axis einsum 7x slower at d_model 9216 (the 17B decode benchmark)."""
    y_btd = sequence_parallel.row_parallel(
        _project_out, [(out_bthc, sequence_parallel.HEADS_AXES)],
        [(self.w_o[...].astype(out_bthc.dtype), initializers.HEAD_OUT_AXES)])
    return y_btd if self.b_o is None else y_btd + self.b_o[...].astype(y_btd.dtype)

  def __call__(self, x_btd: jax.Array) -> jax.Array:
    """Causal self-attention over the sequence, `[B, T, d_model] -> [B, T, d_model]`."""
    q_bthc, k_bthc, v_bthc = self.project_qkv(x_btd, jnp.arange(x_btd.shape[1]))
    return self.project_out(attend_causal(q_bthc, k_bthc, v_bthc, self.attn_dropout,
                                          self.core))

  def init_cache(self, batch: int, max_len: int, dtype) -> dict[str, jax.Array]:
    return init_kv_cache(batch, max_len, self.n_heads, self.head_dim, dtype)

  def decode(self, x_b1d: jax.Array, cache: dict, position: jax.Array) -> tuple[jax.Array, dict]:
    """One token at absolute `position` (int32 scalar, < max_len): `y [B, 1, d_model]`, cache."""
    q_b1hc, k_b1hc, v_b1hc = self.project_qkv(x_b1d, jnp.reshape(position, (1,)))
    out_b1hc, cache = attend_cached(q_b1hc, k_b1hc, v_b1hc, cache, position, self.attn_dropout)
    return self.project_out(out_b1hc), cache

  def flops_per_token(self) -> int:
    """Multiply-adds of the Q, K, V and output projections for one token: `4 d_model H Dh`.

    Excludes the attention itself (`2 H Dh` per visible key), the biases and the rotary
    rotation.
    """
    return 4 * self.d_model * self.n_heads * self.head_dim
