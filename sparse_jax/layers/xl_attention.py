"""Transformer-XL relative multi-head attention (Dai et al. 2019, Sec. 3.3).

For a query at position i of the current segment and a key at position j of `[memory; segment]`
the score is

    (q_i + u) . k_j  +  (q_i + v) . r_{(M + i) - j}

where `r_d = W_r sinusoid(d)` is the projected relative embedding of the distance d, `u` and `v`
are learned per-head content and position biases, and M is the memory length. The position
term is computed for all distances at once and aligned with the pad-and-shift trick
(`rel_shift`). Queries see the whole memory and causally the segment.

Two paths compute the same attention (`impl`, the config's `model.attention_impl`): "xla"
writes the float32 `[B, H, T, M + T]` scores, shifts, masks and softmaxes them in XLA (and the
backward pass reads them again); "pallas" runs the fused kernels of
`pallas_kernels.xl_attention` (flash attention whose scores stay on chip, the position term
read through the skewed index; interpret mode off GPU), which have no attention dropout;
"auto" is "pallas" when tracing for one GPU without attention dropout, else "xla"
(`pallas_kernels.xl_attention.use_fused`).

On a mesh of several devices the fused kernels run inside `jax.shard_map`, each device on its
batch rows and, split over `tensor`, its heads (`fused_per_device`): XLA cannot partition a
GPU kernel's custom call, and would gather whole batches and heads onto every device to run
it. Each head's attention needs only that head's queries, keys, values and position rows, so
the map adds no communication of its own.
"""

import functools
import math

import jax
import jax.numpy as jnp
from flax import nnx

from pallas_kernels.xl_attention import (XL_IMPLS, aligned_width, use_fused, xl_attention,
                                         zero_pad)

from sparse_jax import parallel
from sparse_jax.layers import initializers, sequence_parallel
from sparse_jax.layers.precision import f32_einsum


def sinusoid_embedding(distances_k: jax.Array, dim: int, *,
                       interleaved: bool = False) -> jax.Array:
  """`[K] -> [K, dim]`: sin/cos of the distances at geometric frequencies (Vaswani et al.):
  all sines then all cosines, or with `interleaved` sin and cos of each frequency side by
  side (`[2i]` sin, `[2i + 1]` cos: the SwitchHead authors' layout)."""
  inv_freq = 1.0 / (10000.0 ** (jnp.arange(0, dim, 2, dtype=jnp.float32) / dim))
  angles_kf = distances_k.astype(jnp.float32)[:, None] * inv_freq[None, :]
  if interleaved:
    pairs_kf2 = jnp.stack([jnp.sin(angles_kf), jnp.cos(angles_kf)], axis=-1)
    return pairs_kf2.reshape(distances_k.shape[0], -1)[:, :dim]
  return jnp.concatenate([jnp.sin(angles_kf), jnp.cos(angles_kf)], axis=-1)[:, :dim]


def rel_shift(x_bhtk: jax.Array) -> jax.Array:
  """The pad-and-shift trick: `out[..., i, j] = x[..., i, j + T - 1 - i]`.

  `x[..., i, p]` holds the score of query i against distance `K - 1 - p` (distances in
  descending order); the output holds it against key j, whose distance is `K - T + i - j`.
  Entries with j past the causal limit `K - T + i` are garbage and must be masked.
  """
  b, h, t, k = x_bhtk.shape
  padded = jnp.pad(x_bhtk, ((0, 0), (0, 0), (0, 0), (1, 0)))
  return padded.reshape(b, h, k + 1, t)[:, :, 1:, :].reshape(b, h, t, k)


def attention_mask(t: int, k: int, mem_valid: jax.Array) -> jax.Array:
  """`[T, K]` bool: key j is visible to query i if `K - T - mem_valid <= j <= K - T + i`.

  The first `K - T` keys are memory, of which only the last `mem_valid` hold real tokens.
  """
  m = k - t
  i = jnp.arange(t)[:, None]
  j = jnp.arange(k)[None, :]
  return (j <= m + i) & (j >= m - mem_valid)


def _project_qkv(*args, n_queries: int):
  """`(q [B, T, H, Dh], k, v [B, K, H, Dh])` of the context given in parts (memory, segment:
  concatenated along K), q of its last `n_queries` rows; weights `w_q [d, H, Dh]`,
  `w_kv [2, d, H, Dh]`."""
  *parts_bkd, w_q_dhc, w_kv_2dhc = args
  ctx_bkd = jnp.concatenate(parts_bkd, axis=1) if len(parts_bkd) > 1 else parts_bkd[0]
  x_btd = ctx_bkd[:, ctx_bkd.shape[1] - n_queries:]
  k_bkhc, v_bkhc = jnp.einsum("bkd,sdhc->sbkhc", ctx_bkd, w_kv_2dhc)
  return jnp.einsum("btd,dhc->bthc", x_btd, w_q_dhc), k_bkhc, v_bkhc


def attend_relative(q_content_bthc: jax.Array, q_position_bthc: jax.Array, k_bkhc: jax.Array,
                    v_bkhc: jax.Array, r_khc: jax.Array, scale, mem_valid: jax.Array,
                    dropout: nnx.Dropout, *, fused: bool = False) -> jax.Array:
  """`softmax((q_c . k_j + q_p . r_{i-j}) * scale, masked) V -> [B, T, H, Dh]`: the XL score
  of every query against `[memory; segment]`, `r_khc` the projected relative embeddings in
  descending distance (row p: distance K - 1 - p, aligned by `rel_shift`); float32 scores.
  With `fused` the same math runs in `pallas_kernels.xl_attention` (no dropout: the caller
  checks, `use_fused`), on each device's rows and heads (`fused_per_device`)."""
  if fused:
    return fused_per_device(q_content_bthc, q_position_bthc, k_bkhc, v_bkhc, r_khc, scale,
                            mem_valid)
  t, k = q_content_bthc.shape[1], k_bkhc.shape[1]
  content_bhtk = f32_einsum("bthc,bkhc->bhtk", q_content_bthc, k_bkhc)
  position_bhtk = f32_einsum("bthc,khc->bhtk", q_position_bthc, r_khc)
  scores_bhtk = (content_bhtk + rel_shift(position_bhtk)) * scale
  scores_bhtk = jnp.where(attention_mask(t, k, mem_valid), scores_bhtk, -1e30)
  probs_bhtk = dropout(jax.nn.softmax(scores_bhtk, axis=-1)).astype(v_bkhc.dtype)
  return jnp.einsum("bhtk,bkhc->bthc", probs_bhtk, v_bkhc)


def fused_per_device(q_u_bthc, q_v_bthc, k_bkhc, v_bkhc, r_khc, scale, mem_valid):
  """`pallas_kernels.xl_attention`, on a mesh of several devices (`jax.set_mesh`) inside
  `jax.shard_map`: each device on its batch rows (`parallel`'s batch axes) and its heads
  (`tensor`), where they divide; `r` split by head alone. The map does not check varying
  axes (Pallas GPU kernels declare none): its transpose sums the gradients of `r` over the
  batch axes and that of a learned scale over every device."""
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty or mesh.size == 1:
    return xl_attention(q_u_bthc, q_v_bthc, k_bkhc, v_bkhc, r_khc, scale, mem_valid)
  only = parallel.mesh_axes("batch", mesh) + (parallel.TENSOR,)
  rows = lambda x: parallel.partition_spec(("batch", None, "heads", None), x.shape, mesh, only)
  positions = parallel.partition_spec((None, "heads", None), r_khc.shape, mesh,
                                      (parallel.TENSOR,))
  scalar = jax.sharding.PartitionSpec()
  mapped = jax.shard_map(
      xl_attention, in_specs=(*map(rows, (q_u_bthc, q_v_bthc, k_bkhc, v_bkhc)), positions,
                              scalar, scalar),
      out_specs=rows(q_u_bthc), check_vma=False)
  return mapped(q_u_bthc, q_v_bthc, k_bkhc, v_bkhc, r_khc, jnp.asarray(scale, jnp.float32),
                jnp.asarray(mem_valid, jnp.int32))


class RelativeMultiHeadAttention(nnx.Module):
  """Multi-head attention with Transformer-XL relative positions over `[memory; segment]`.

  Scores are scaled by `1/sqrt(head_dim)`, or with `learned_scale` by one trained scalar
  starting there (the sigma-MoE authors' Transformer-XL). The biases u and v start at zero,
  or drawn from N(0, `bias_init_std`^2). `impl` picks the attention core
  (module docstring; `pallas_kernels.xl_attention.XL_IMPLS`): "pallas" with attention dropout
  is a ValueError.
  """

  RESIDUAL_OUTPUTS = ("w_o",)

  def __init__(self, d_model: int, n_heads: int, head_dim: int, *, n_layers: int,
               attn_dropout: float = 0.0, learned_scale: bool = False,
               bias_init_std: float = 0.0, impl: str = "auto", rngs: nnx.Rngs):
    if impl not in XL_IMPLS:
      raise ValueError(f"impl must be one of {XL_IMPLS}, got {impl!r}")
    if impl == "pallas" and attn_dropout > 0:
      raise ValueError(f"impl='pallas' (the fused XL attention) has no attention dropout: "
                       f"attn_dropout must be 0, got {attn_dropout}")
    self.d_model, self.n_heads, self.head_dim, self.impl = d_model, n_heads, head_dim, impl
    # Q, K, V and the relative-position projection R, then the output.
    self.w_q, self.w_k, self.w_v, self.w_r, self.w_o = initializers.head_projections(
        d_model, n_heads, head_dim, n_layers=n_layers, n_inputs=4, rngs=rngs)
    # The content and position biases u, v: zeros, or N(0, bias_init_std^2).
    bias_init = jax.nn.initializers.normal(bias_init_std)
    self.u_bias, self.v_bias = (
        nnx.Param(bias_init(rngs.params(), (n_heads, head_dim)) if bias_init_std
                  else jnp.zeros((n_heads, head_dim)), logical_axes=("heads", "head_dim"))
        for _ in range(2))
    self.attn_dropout = nnx.Dropout(attn_dropout, rngs=rngs)
    self.scale = (nnx.Param(jnp.full((), 1 / math.sqrt(head_dim), jnp.float32), logical_axes=())
                  if learned_scale else None)

  def __call__(self, ctx_bkd: jax.Array | tuple[jax.Array, ...], n_queries: int,
               mem_valid: jax.Array) -> jax.Array:
    """Attends from the last `n_queries` rows of the context to the whole context.

    Args:
      ctx_bkd: `[B, K, d_model]` normalised `[memory; segment]`, K = M + T; or its parts
        (memory, segment) to be joined along K, as the decoder block gives them under
        sequence parallelism (`layers.sequence_parallel`: each gathered from its shards).
      n_queries: T, the segment length; the queries are `ctx_bkd[:, -T:]`.
      mem_valid: int scalar, how many trailing memory rows hold real tokens.
    Returns:
      `[B, T, d_model]`.
    """
    parts = tuple(ctx_bkd) if isinstance(ctx_bkd, (tuple, list)) else (ctx_bkd,)
    dtype = parts[0].dtype
    k, t = sum(part.shape[1] for part in parts), n_queries
    fused = use_fused(self.impl, self.attn_dropout.rate)
    # The fused kernels load whole 16-byte vectors: their heads get zero channels up to a
    # whole number of them (41 -> 48 in bf16) in the weights, so the projections write padded
    # heads and the output projection reads them; the padding's products are zeros.
    width = aligned_width(self.head_dim, dtype) if fused else self.head_dim
    head_weight = lambda w, axis: zero_pad(w[...].astype(dtype), width, axis)
    # K and V in one product, so that the backward pass forms the context's gradient from
    # both in one matmul: split over `tensor` (by head), one all-reduce of it, not two.
    w_kv_2dhc = jnp.stack([head_weight(self.w_k, 2), head_weight(self.w_v, 2)])
    head_in = initializers.HEAD_IN_AXES
    q_bthc, k_bkhc, v_bkhc = sequence_parallel.column_parallel(
        functools.partial(_project_qkv, n_queries=t), parts,
        [(head_weight(self.w_q, 2), head_in), (w_kv_2dhc, (None,) + head_in)],
        [sequence_parallel.HEADS_AXES] * 3)
    distances_k = jnp.arange(k - 1, -1, -1)
    pos_kd = sinusoid_embedding(distances_k, self.d_model).astype(dtype)
    r_khc = jnp.einsum("kd,dhc->khc", pos_kd, head_weight(self.w_r, 2))

    q_u = q_bthc + head_weight(self.u_bias, 1)
    q_v = q_bthc + head_weight(self.v_bias, 1)
    scale = 1 / math.sqrt(self.head_dim) if self.scale is None else self.scale[...]
    out_bthc = attend_relative(q_u, q_v, k_bkhc, v_bkhc, r_khc, scale, mem_valid,
                               self.attn_dropout, fused=fused)
    return sequence_parallel.row_parallel(
        functools.partial(jnp.einsum, "bthc,hcd->btd"),
        [(out_bthc, sequence_parallel.HEADS_AXES)],
        [(head_weight(self.w_o, 1), initializers.HEAD_OUT_AXES)])
