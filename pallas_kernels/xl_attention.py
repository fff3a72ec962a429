"""Fused Transformer-XL relative attention (issue 60): flash attention whose scores never
reach memory, with the XL position term read in the kernel.

    out = xl_attention(q_u, q_v, k, v, r, scale, mem_valid)        # [B, T, H, Dh]

is exactly `sparse_jax.layers.xl_attention.attend_relative` with dropout off:

    s[i, j] = ((q_u[i] . k[j]) + (q_v[i] . r[K - 1 - d(i, j)])) * scale,  d(i, j) = K - T + i - j
    visible: K - T - mem_valid <= j <= K - T + i;  out[i] = softmax_j(s[i]) @ v

q_u, q_v [B, T, H, Dh]; k, v [B, K, H, Dh] (K = M + T: memory then segment); r [K, H, Dh]
the projected relative embeddings in descending distance (row p holds distance K - 1 - p);
scale a Python float or a traced f32 scalar (a learned scale: it gets its gradient);
mem_valid an int scalar (traced), how many trailing memory rows hold real tokens.

Where the position term comes from (the design choice). Of the three ways considered:
(a) gather the window of r rows each (query block, key block) tile needs and reduce
q_v . r on CUDA cores: a [bq, bk, Dh] register tile per block, too large for the registers at
useful block sizes; (b) a [bq, bq + bk - 1] tile matmul q_v @ r_window^T, then a skewed
extraction: Triton has no register gather; (c), taken here: the *unshifted* position scores
P = q_v @ r^T [B, H, T, K] are one XLA matmul per layer in the compute dtype (one write), and
the kernels read each tile's position scores from P through the skewed index
(`P[i, j + T - 1 - i]`: P laid out [H, B, T, K] as the batched GEMM writes it, with a zero
column before and any after its K columns so that each tile row's run of keys starts on a
16-byte boundary, `PositionLayout`), so the float32 [B, H, T, K] scores, the shift, the mask
and the softmax never touch memory. P is not kept for the backward pass: it
is recomputed there from q_v and r (one more small GEMM, where keeping it cost 168 MB a layer
of memory, and under `model.scan_layers` copies into and out of the stacked residuals). The
backward kernel writes dP (the score gradient at the same skewed places, zeros where no key
is) once, and XLA forms dq_v = dP @ r and dr = dP^T q_v from it. In float32 this is the current math
exactly (tested); in bfloat16 the position scores are rounded to bf16 before being added to
the f32 content scores (the XLA path adds them in f32).

Memory traffic at the WT-103 S layer (B 64, H 10, T 256, K 512, bf16; B H T K = 84 M
elements, 168 MB in bf16): forward P written and read once (0.34 GB); backward P written
again, read by the dk/dv and the dq kernels, dP written once and read by its two matmuls
(1.0 GB): about 1.4 GB per layer, 22 GB for the 16 layers, against the 116 GB the XLA path's
attention moves per step (benchmarks/step_profile), plus the q/k/v tile reads (k and v once
per query block).

Kernels (Pallas Triton; interpret mode off GPU), on 2-D views of the inputs (free
reshapes: q [B T, H Dh], k and v [B K, H Dh], P flat) with every tile masked, so no size has
to be a power of 2 or a multiple of a block. Heads are padded with zero channels to whole
16-byte vectors in memory (41 -> 48 in bf16: by `xl_attention`, or by the XL layer in its
weights, so no activation is copied) and to a power of 2 in registers (64). Unpadded, no row
of q, k, v or P started on a vector boundary, and Triton compiled every load of the three
kernels for an H100 to 2-byte loads, without the asynchronous copies that pipeline them;
padded, they are 16-byte loads and `cp.async` (tests/aot/test_xl_attention_compile.py):
`_forward_kernel` (grid: query blocks x B H) runs the online softmax over the key blocks a
query block can see, f32 accumulation, and saves the log-sum-exp; `_dkdv_kernel` (key
blocks x B H) recomputes the probabilities from q, k, P and the lse and accumulates dk, dv;
`_dq_kernel` (query blocks x B H) accumulates dq_u and writes dP. Block sizes come from
`xl_blocks` (a rule on T, K, Dh and the dtype), not from inside the kernels; untuned on a GPU.

The gradient of a traced scale: with ds the gradient of the scaled scores,
d scale = sum(ds * (content + position)) = sum(q_u * (ds @ k)) + sum(q_v * (dP @ r)), formed in
XLA from the kernels' unscaled dq_u and the dq_v matmul; no extra kernel work.
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from pallas_kernels import backends
from pallas_kernels.triton_matmul import dot_precision, pow2_block, triton_compiler_params

# attention_impl values for the XL kinds: "xla" the XLA path (scores in memory), "pallas" the
# fused kernels (interpret mode off GPU), "auto" the fused kernels when tracing for one GPU
# with attention dropout off, else the XLA path.
XL_IMPLS = ("auto", "pallas", "xla")
_MASKED = -1e30
# One vectorised global load or cp.async: rows and row starts that are whole vectors let Triton
# load tiles 16 bytes at a time (and pipeline them); WT-103 S's 41-wide heads did not.
_VECTOR_BYTES = 16


@dataclasses.dataclass(frozen=True)
class XLBlocks:
  """Tiles: `q` queries by `k` keys per step, head dim padded to `d` (a power of 2 >= 16)."""
  q: int
  k: int
  d: int
  num_warps: int = 4
  num_stages: int = 2


def xl_blocks(t: int, k: int, head_dim: int, dtype, kernel: str = "forward") -> XLBlocks:
  """Tiles of `kernel` ("forward", "dkdv" or "dq"): 64 x 64 (32 x 32 in float32 or in the
  backward kernels, which hold more f32 tiles), shrunk for small problems; the head dim padded
  to the next power of 2. Warps: 8 for the forward's 64 x 64 tiles, the float32 dk/dv kernel
  and heads past 64, else 4. From ptxas at the WT-103 S shape (head dim 41): with 4 warps the
  bf16 forward took 255 registers on an A100 and spilled, as did the f32 dk/dv kernel (800
  bytes); the f32 dq kernel spilled 16 bytes on an H100 with 8 (capped at 128 registers),
  none with 4 (tests/aot/test_xl_attention_compile.py)."""
  f32 = jnp.dtype(dtype).itemsize >= 4
  d = pow2_block(1 << 30, head_dim)
  size = 32 if (kernel != "forward" or f32) else 64
  q, kb = pow2_block(size, t), pow2_block(size, k)
  wide = {"forward": q * kb >= 64 * 64 or f32, "dkdv": f32, "dq": False}[kernel] or d > 64
  return XLBlocks(q=q, k=kb, d=d, num_warps=8 if wide else 4)


@dataclasses.dataclass(frozen=True)
class XLTiles:
  """Tiles of each kernel ("forward", "dkdv", "dq"); None takes `xl_blocks`' rule. For
  sweeps (`benchmarks/tune_blocks.py`); the model runs the rule."""
  forward: XLBlocks | None = None
  dkdv: XLBlocks | None = None
  dq: XLBlocks | None = None

  def of(self, kernel: str, t: int, k: int, head_dim: int, dtype) -> XLBlocks:
    """`kernel`'s tiles: the ones given, else the rule's for this problem."""
    return getattr(self, kernel) or xl_blocks(t, k, head_dim, dtype, kernel)


def use_fused(impl: str, attn_dropout: float) -> bool:
  """Whether the XL attention runs the fused kernels for `impl` (`XL_IMPLS`; the grouped
  matmul impls of `pallas_kernels.IMPLS` other than pallas and auto mean the XLA path) and the
  attention-dropout rate. "pallas": always (a ValueError with dropout, which the kernels do not
  have). "auto": when tracing for a single GPU without attention dropout (XLA cannot split a
  Pallas call over a mesh). On an H200 (2026-11-28, benchmarks/RESULTS.md) the fused path made
  the WT-103 S training steps 1.20x (dense) and 1.23x (sigma-MoE) faster with a third less
  memory."""
  if impl == "auto":
    return attn_dropout == 0 and backends.targets_gpu() and _one_device()
  if impl != "pallas":
    return False
  if attn_dropout > 0:
    raise ValueError(f"the fused XL attention (attention_impl='pallas') has no attention "
                     f"dropout: set attn_dropout=0 (got {attn_dropout}) or another impl")
  return True


def _one_device() -> bool:
  """One device traced for: the mesh in scope's, else the process's."""
  mesh = jax.sharding.get_abstract_mesh()
  return (jax.device_count() if mesh.empty else mesh.size) == 1


# ----------------------------------------------------------------------------------------------
# The reference: the XLA math of attend_relative (dropout off), for tests.

def xl_attention_reference(q_u, q_v, k, v, r, scale, mem_valid):
  """The scores in memory, as `attend_relative` computes them (float32 scores)."""
  t, kk = q_u.shape[1], k.shape[1]
  content = jnp.einsum("bthc,bkhc->bhtk", q_u, k, preferred_element_type=jnp.float32)
  position = jnp.einsum("bthc,khc->bhtk", q_v, r, preferred_element_type=jnp.float32)
  i = jnp.arange(t)[:, None]
  j = jnp.arange(kk)[None, :]
  p = j + t - 1 - i
  shifted = jnp.take_along_axis(position, jnp.broadcast_to(jnp.clip(p, 0, kk - 1),
                                                           position.shape), axis=-1)
  m = kk - t
  visible = (j <= m + i) & (j >= m - mem_valid)
  scores = jnp.where(visible, (content + shifted) * scale, _MASKED)
  probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
  return jnp.einsum("bhtk,bkhc->bthc", probs, v)


# ----------------------------------------------------------------------------------------------
# Kernels. Shared: the (b, h) of a program, tile loads, the scores of one tile.

def aligned_width(n: int, dtype) -> int:
  """n rounded up to whole 16-byte vectors of `dtype` (8 bf16, 4 f32 elements)."""
  per_vector = _VECTOR_BYTES // jnp.dtype(dtype).itemsize
  return -(-n // per_vector) * per_vector


def zero_pad(x: jax.Array, size: int, axis: int = -1) -> jax.Array:
  """`x` with zeros appended along `axis` up to `size` (heads up to `aligned_width`)."""
  if x.shape[axis] == size:
    return x
  widths = [(0, 0)] * x.ndim
  widths[axis] = (0, size - x.shape[axis])
  return jnp.pad(x, widths)


class PositionLayout:
  """How P is stored: [H B T, `width`], its K columns after `lead` zero columns, so that
  (query i, key j) is at `i (width - 1) + lead + T - 1 + j` of its (b, h) plane.

  `width - 1` and `lead + T - 1` are whole vectors, so a tile's row of keys starts on a vector
  boundary (every plane does too when T is a whole number of vectors), and `lead + K <=
  width`, so every (i < T, j < K) lies inside its own plane: a tile loads with a rectangular
  mask, which keeps its loads vectorised where a per-entry mask would not."""

  def __init__(self, t: int, kk: int, dtype):
    self.lead = aligned_width(t - 1, dtype) - (t - 1)
    self.width = aligned_width(kk + self.lead - 1, dtype) + 1


class _Dims:
  """Static sizes of one call; `d` is the head width in memory (`aligned_width`)."""

  def __init__(self, b, t, kk, h, d, blocks: XLBlocks, dtype, interpret: bool = False):
    self.b, self.t, self.k, self.h, self.d, self.blocks = b, t, kk, h, d, blocks
    self.m = kk - t
    self.position = PositionLayout(t, kk, dtype)
    # dP's columns. Interpret mode stores a masked scatter as gather, select, scatter, so two
    # masked entries aimed at one column could put back a stale value over a real one: there
    # each masked entry of a tile row gets its own spare column past K (sliced off after).
    self.interpret = interpret
    self.dp_width = kk + (blocks.k if interpret else 0)


def _load_tile(ref, row0, n_rows, row_mask, col0, dims: _Dims):
  """The [n_rows, Dp] tile of one head: rows row0.. of a [rows, H Dh] view, columns col0.."""
  cols = jnp.arange(dims.blocks.d)
  return plgpu.load(ref.at[pl.ds(row0, n_rows), pl.ds(col0, dims.blocks.d)],
                    mask=row_mask[:, None] & (cols < dims.d)[None, :], other=0.0)


def _store_tile(ref, value, row0, n_rows, row_mask, col0, dims: _Dims):
  cols = jnp.arange(dims.blocks.d)
  plgpu.store(ref.at[pl.ds(row0, n_rows), pl.ds(col0, dims.blocks.d)], value.astype(ref.dtype),
              mask=row_mask[:, None] & (cols < dims.d)[None, :])


def _skew(rows_i, keys_j, dims: _Dims):
  """P's column of (query i, key j), and where it exists."""
  p = keys_j[None, :] + (dims.t - 1) - rows_i[:, None]
  return p, (p >= 0) & (p < dims.k)


def _position_row0(b, h, dims: _Dims):
  """P's first row of (b, h): P is [H, B, T, width] (flattened), the layout of the batched
  GEMM (batch H, rows B T) that makes it, so XLA transposes no [B, H, T, K] array."""
  return (h * dims.b + b) * dims.t


def _load_position(p_ref, p_row0, rows_i, keys_j, in_range, dims: _Dims):
  """P's entries of a tile (zeros where not `in_range`, rectangular) from the flat P
  (`PositionLayout`), the index written so that Triton sees each row's keys contiguous and
  starting on a vector boundary (`(width - 1) i`, not `width i - i`)."""
  layout = dims.position
  index = (p_row0 * layout.width + rows_i[:, None] * (layout.width - 1)
           + (layout.lead + dims.t - 1) + keys_j[None, :])
  if dims.interpret:  # interpret mode gathers masked entries too: keep them in bounds
    index = jnp.where(in_range, index, 0)
  return plgpu.load(p_ref.at[index], mask=in_range, other=0.0)


def _tile_scores(q_u, k_tile, p_ref, p_row0, rows_i, keys_j, scale, mem_valid, dims: _Dims):
  """(scaled scores, visible) of a [bq, bk] tile: q_u . k + P through the skewed index."""
  in_range = (rows_i < dims.t)[:, None] & (keys_j < dims.k)[None, :]
  visible = (in_range & (keys_j[None, :] <= dims.m + rows_i[:, None])
             & (keys_j[None, :] >= dims.m - mem_valid))
  position = _load_position(p_ref, p_row0, rows_i, keys_j, in_range, dims)
  content = jnp.dot(q_u, k_tile.T, precision=dot_precision(q_u.dtype),
                    preferred_element_type=jnp.float32)
  scores = (content + position.astype(jnp.float32)) * scale
  return jnp.where(visible, scores, _MASKED), visible


def _key_block_range(i0, mem_valid, dims: _Dims):
  """[lo, hi) key blocks that queries i0 .. i0 + bq - 1 can see."""
  bk = dims.blocks.k
  lo = jnp.maximum(dims.m - mem_valid, 0) // bk
  hi = (jnp.minimum(dims.k, dims.m + i0 + dims.blocks.q) + bk - 1) // bk
  return lo, hi


def _forward_kernel(scale_ref, mem_valid_ref, q_ref, k_ref, v_ref, p_ref, o_ref, lse_ref, *,
                    dims: _Dims):
  bq, bk = dims.blocks.q, dims.blocks.k
  qb, bh = pl.program_id(0), pl.program_id(1)
  b, h = bh // dims.h, bh % dims.h
  scale, mem_valid = scale_ref[0], mem_valid_ref[0]
  i0 = qb * bq
  rows_i = i0 + jnp.arange(bq)
  row_ok = rows_i < dims.t
  q_u = _load_tile(q_ref, b * dims.t + i0, bq, row_ok, h * dims.d, dims)
  p_row0 = _position_row0(b, h, dims)

  def body(kb, carry):
    acc, m_prev, l_prev = carry
    keys_j = kb * bk + jnp.arange(bk)
    k_tile = _load_tile(k_ref, b * dims.k + kb * bk, bk, keys_j < dims.k, h * dims.d, dims)
    v_tile = _load_tile(v_ref, b * dims.k + kb * bk, bk, keys_j < dims.k, h * dims.d, dims)
    scores, visible = _tile_scores(q_u, k_tile, p_ref, p_row0, rows_i, keys_j, scale, mem_valid,
                                   dims)
    m_next = jnp.maximum(m_prev, jnp.max(scores, axis=1))
    correction = jnp.exp(m_prev - m_next)
    probs = jnp.where(visible, jnp.exp(scores - m_next[:, None]), 0.0)
    l_next = correction * l_prev + jnp.sum(probs, axis=1)
    acc = correction[:, None] * acc + jnp.dot(
        probs.astype(v_tile.dtype), v_tile, precision=dot_precision(v_tile.dtype),
        preferred_element_type=jnp.float32)
    return acc, m_next, l_next

  lo, hi = _key_block_range(i0, mem_valid, dims)
  acc, m_i, l_i = lax.fori_loop(
      lo, hi, body, (jnp.zeros((bq, dims.blocks.d), jnp.float32),
                     jnp.full((bq,), _MASKED, jnp.float32), jnp.zeros((bq,), jnp.float32)))
  l_safe = jnp.where(l_i > 0, l_i, 1.0)
  _store_tile(o_ref, acc / l_safe[:, None], b * dims.t + i0, bq, row_ok, h * dims.d, dims)
  plgpu.store(lse_ref.at[pl.ds(bh * dims.t + i0, bq)], m_i + jnp.log(l_safe), mask=row_ok)


def _dkdv_kernel(scale_ref, mem_valid_ref, q_ref, k_ref, v_ref, p_ref, do_ref, lse_ref,
                 delta_ref, dk_ref, dv_ref, *, dims: _Dims):
  """dk_raw = ds^T q_u (unscaled: the caller multiplies by scale), dv = probs^T do."""
  bq, bk = dims.blocks.q, dims.blocks.k
  kb, bh = pl.program_id(0), pl.program_id(1)
  b, h = bh // dims.h, bh % dims.h
  scale, mem_valid = scale_ref[0], mem_valid_ref[0]
  j0 = kb * bk
  keys_j = j0 + jnp.arange(bk)
  key_ok = keys_j < dims.k
  k_tile = _load_tile(k_ref, b * dims.k + j0, bk, key_ok, h * dims.d, dims)
  v_tile = _load_tile(v_ref, b * dims.k + j0, bk, key_ok, h * dims.d, dims)
  p_row0 = _position_row0(b, h, dims)

  def body(qb, carry):
    dk, dv = carry
    rows_i = qb * bq + jnp.arange(bq)
    row_ok = rows_i < dims.t
    q_u = _load_tile(q_ref, b * dims.t + qb * bq, bq, row_ok, h * dims.d, dims)
    do = _load_tile(do_ref, b * dims.t + qb * bq, bq, row_ok, h * dims.d, dims)
    stats = pl.ds(bh * dims.t + qb * bq, bq)
    lse = plgpu.load(lse_ref.at[stats], mask=row_ok, other=0.0)
    delta = plgpu.load(delta_ref.at[stats], mask=row_ok, other=0.0)
    scores, visible = _tile_scores(q_u, k_tile, p_ref, p_row0, rows_i, keys_j, scale, mem_valid,
                                   dims)
    probs = jnp.where(visible, jnp.exp(scores - lse[:, None]), 0.0)
    dv = dv + jnp.dot(probs.astype(do.dtype).T, do, precision=dot_precision(do.dtype),
                      preferred_element_type=jnp.float32)
    dp = jnp.dot(do, v_tile.T, precision=dot_precision(do.dtype),
                 preferred_element_type=jnp.float32)
    ds = probs * (dp - delta[:, None])
    dk = dk + jnp.dot(ds.astype(q_u.dtype).T, q_u, precision=dot_precision(q_u.dtype),
                      preferred_element_type=jnp.float32)
    return dk, dv

  # Queries that see key j: j <= M + i, so i >= j - M; none if the block is all older memory.
  lo = jnp.maximum(j0 - dims.m, 0) // bq
  hi = jnp.where(j0 + bk - 1 >= dims.m - mem_valid, pl.cdiv(dims.t, bq), lo)
  zeros = jnp.zeros((bk, dims.blocks.d), jnp.float32)
  dk, dv = lax.fori_loop(lo, hi, body, (zeros, zeros))
  _store_tile(dk_ref, dk, b * dims.k + j0, bk, key_ok, h * dims.d, dims)
  _store_tile(dv_ref, dv, b * dims.k + j0, bk, key_ok, h * dims.d, dims)


def _dq_kernel(scale_ref, mem_valid_ref, q_ref, k_ref, v_ref, p_ref, do_ref, lse_ref,
               delta_ref, dq_ref, dp_ref, *, dims: _Dims):
  """dq_raw = ds k (unscaled) and dP[i, j + T - 1 - i] = ds[i, j] (unscaled), zeros in the
  columns of P no visited key reaches."""
  bq, bk = dims.blocks.q, dims.blocks.k
  qb, bh = pl.program_id(0), pl.program_id(1)
  b, h = bh // dims.h, bh % dims.h
  scale, mem_valid = scale_ref[0], mem_valid_ref[0]
  i0 = qb * bq
  rows_i = i0 + jnp.arange(bq)
  row_ok = rows_i < dims.t
  q_u = _load_tile(q_ref, b * dims.t + i0, bq, row_ok, h * dims.d, dims)
  do = _load_tile(do_ref, b * dims.t + i0, bq, row_ok, h * dims.d, dims)
  stats = pl.ds(bh * dims.t + i0, bq)
  lse = plgpu.load(lse_ref.at[stats], mask=row_ok, other=0.0)
  delta = plgpu.load(delta_ref.at[stats], mask=row_ok, other=0.0)
  p_row0 = _position_row0(b, h, dims)
  p_rows = jnp.where(row_ok, p_row0 + rows_i, 0)

  def body(kb, dq):
    keys_j = kb * bk + jnp.arange(bk)
    k_tile = _load_tile(k_ref, b * dims.k + kb * bk, bk, keys_j < dims.k, h * dims.d, dims)
    v_tile = _load_tile(v_ref, b * dims.k + kb * bk, bk, keys_j < dims.k, h * dims.d, dims)
    scores, visible = _tile_scores(q_u, k_tile, p_ref, p_row0, rows_i, keys_j, scale, mem_valid,
                                   dims)
    probs = jnp.where(visible, jnp.exp(scores - lse[:, None]), 0.0)
    dp = jnp.dot(do, v_tile.T, precision=dot_precision(do.dtype),
                 preferred_element_type=jnp.float32)
    ds = probs * (dp - delta[:, None])
    p, p_ok = _skew(rows_i, keys_j, dims)
    in_p = row_ok[:, None] & (keys_j < dims.k)[None, :] & p_ok
    spare = dims.k + jnp.arange(bk)[None, :] if dims.interpret else 0
    plgpu.store(dp_ref.at[p_rows[:, None], jnp.where(in_p, p, spare)],
                ds.astype(dp_ref.dtype), mask=in_p)
    return dq + jnp.dot(ds.astype(k_tile.dtype), k_tile, precision=dot_precision(k_tile.dtype),
                        preferred_element_type=jnp.float32)

  lo, hi = _key_block_range(i0, mem_valid, dims)
  dq = lax.fori_loop(lo, hi, body, jnp.zeros((bq, dims.blocks.d), jnp.float32))
  _store_tile(dq_ref, dq, b * dims.t + i0, bq, row_ok, h * dims.d, dims)

  # Columns p < lo bk + T - 1 - i of row i belong to no visited key: zeros, written in
  # contiguous column blocks.
  bound_i = lo * bk + (dims.t - 1) - rows_i

  def zero_block(pb, carry):
    cols = pb * bk + jnp.arange(bk)
    mask = row_ok[:, None] & (cols[None, :] < bound_i[:, None]) & (cols < dims.k)[None, :]
    plgpu.store(dp_ref.at[pl.ds(p_row0 + i0, bq), pl.ds(pb * bk, bk)],
                jnp.zeros((bq, bk), dp_ref.dtype), mask=mask)
    return carry

  n_zero = jnp.minimum((lo * bk + dims.t - 1 - i0 + bk - 1) // bk, pl.cdiv(dims.k, bk))
  lax.fori_loop(0, n_zero, zero_block, 0)


# ----------------------------------------------------------------------------------------------
# The op.

def _heads_first(x_bthc):
  """[B, T, H, Dh] -> [H, B T, Dh]."""
  b, t, h, d = x_bthc.shape
  return jnp.transpose(x_bthc, (2, 0, 1, 3)).reshape(h, b * t, d)


def _scalars(scale, mem_valid, m):
  scale_1 = jnp.reshape(jnp.asarray(scale, jnp.float32), (1,))
  mem_valid_1 = jnp.reshape(jnp.clip(jnp.asarray(mem_valid, jnp.int32), 0, m), (1,))
  return scale_1, mem_valid_1


def _call(kernel, name, dims: _Dims, grid, out_shape, interpret, *args):
  return pl.pallas_call(
      functools.partial(kernel, dims=dims), out_shape=out_shape, grid=grid,
      compiler_params=triton_compiler_params(dims.blocks.num_warps, dims.blocks.num_stages),
      interpret=interpret, name=name)(*args)


def _position_scores(q_v, r, dims: _Dims):
  """The unshifted position scores, flat, in `dims.position`'s layout: the GEMM against r
  with zero rows around it, in the compute dtype (it accumulates in f32 and rounds once). The
  backward pass recomputes them from q_v and r rather than keeping them: one small GEMM
  against `[H, B T, K]` stored per layer (168 MB a layer of WT-103 S at batch 64)."""
  layout = dims.position
  r_pad = jnp.pad(r, ((layout.lead, layout.width - layout.lead - dims.k), (0, 0), (0, 0)))
  position = jnp.einsum("hnc,hkc->hnk", _heads_first(q_v),
                        jnp.swapaxes(r_pad, 0, 1).astype(q_v.dtype),
                        preferred_element_type=q_v.dtype, precision=dot_precision(q_v.dtype))
  return position.reshape(-1)


def _forward(q_u, q_v, k, v, r, scale, mem_valid, interpret, tiles: XLTiles):
  b, t, h, d = q_u.shape
  kk = k.shape[1]
  dims = _Dims(b, t, kk, h, d, tiles.of("forward", t, kk, d, q_u.dtype), q_u.dtype, interpret)
  scale_1, mem_valid_1 = _scalars(scale, mem_valid, kk - t)
  position = _position_scores(q_v, r, dims)
  out, lse = _call(
      _forward_kernel, "xl_attention_forward", dims, (pl.cdiv(t, dims.blocks.q), b * h),
      (jax.ShapeDtypeStruct((b * t, h * d), q_u.dtype),
       jax.ShapeDtypeStruct((b * h * t,), jnp.float32)), interpret,
      scale_1, mem_valid_1, q_u.reshape(b * t, h * d), k.reshape(b * kk, h * d),
      v.reshape(b * kk, h * d), position)
  return out.reshape(b, t, h, d), (lse, out)


@functools.partial(jax.custom_vjp, nondiff_argnums=(7, 8))
def _xl_attention(q_u, q_v, k, v, r, scale, mem_valid, interpret, tiles):
  return _forward(q_u, q_v, k, v, r, scale, mem_valid, interpret, tiles)[0]


def _xl_attention_fwd(q_u, q_v, k, v, r, scale, mem_valid, interpret, tiles):
  out, (lse, out2) = _forward(q_u, q_v, k, v, r, scale, mem_valid, interpret, tiles)
  return out, (q_u, q_v, k, v, r, scale, mem_valid, lse, out2)


def _xl_attention_bwd(interpret, tiles, residuals, dout):
  q_u, q_v, k, v, r, scale, mem_valid, lse, out = residuals
  b, t, h, d = q_u.shape
  kk = k.shape[1]
  dims = _Dims(b, t, kk, h, d, tiles.of("dkdv", t, kk, d, q_u.dtype), q_u.dtype, interpret)
  dq_dims = _Dims(b, t, kk, h, d, tiles.of("dq", t, kk, d, q_u.dtype), q_u.dtype, interpret)
  position = _position_scores(q_v, r, dims)
  scale_1, mem_valid_1 = _scalars(scale, mem_valid, kk - t)
  dout = dout.astype(q_u.dtype)
  # sum_c out * dout per (b, h, t): a reduction, not an f32 dot.
  delta = jnp.sum(out.reshape(b, t, h, d).astype(jnp.float32) * dout.astype(jnp.float32),
                  axis=-1)
  delta = jnp.transpose(delta, (0, 2, 1)).reshape(b * h * t)
  args = (scale_1, mem_valid_1, q_u.reshape(b * t, h * d), k.reshape(b * kk, h * d),
          v.reshape(b * kk, h * d), position, dout.reshape(b * t, h * d), lse, delta)
  dk_raw, dv = _call(
      _dkdv_kernel, "xl_attention_dkdv", dims, (pl.cdiv(kk, dims.blocks.k), b * h),
      (jax.ShapeDtypeStruct((b * kk, h * d), jnp.float32),
       jax.ShapeDtypeStruct((b * kk, h * d), jnp.float32)), interpret, *args)
  dq_raw, dp_raw = _call(
      _dq_kernel, "xl_attention_dq", dq_dims, (pl.cdiv(t, dq_dims.blocks.q), b * h),
      (jax.ShapeDtypeStruct((b * t, h * d), jnp.float32),
       jax.ShapeDtypeStruct((b * h * t, dq_dims.dp_width), q_u.dtype)), interpret, *args)
  dp_raw = dp_raw[:, :kk].reshape(h, b * t, kk)  # [H, B T, K] as P.
  dq_v_raw = jnp.einsum("hnk,hkc->hnc", dp_raw, jnp.swapaxes(r, 0, 1),
                        preferred_element_type=jnp.float32, precision=dot_precision(r.dtype))
  dq_v_raw = jnp.transpose(dq_v_raw.reshape(h, b, t, d), (1, 2, 0, 3))
  dr_raw = jnp.swapaxes(jnp.einsum("hnk,hnc->hkc", dp_raw, _heads_first(q_v),
                                   preferred_element_type=jnp.float32,
                                   precision=dot_precision(q_v.dtype)), 0, 1)
  dq_raw = dq_raw.reshape(b, t, h, d)
  scale_f = jnp.asarray(scale, jnp.float32)
  d_scale = (jnp.sum(q_u.astype(jnp.float32) * dq_raw)
             + jnp.sum(q_v.astype(jnp.float32) * dq_v_raw))
  grads = (dq_raw * scale_f, dq_v_raw * scale_f, dk_raw.reshape(b, kk, h, d) * scale_f,
           dv.reshape(b, kk, h, d), dr_raw * scale_f)
  grads = tuple(g.astype(x.dtype) for g, x in zip(grads, (q_u, q_v, k, v, r)))
  d_scale = jnp.reshape(d_scale, jnp.shape(scale)).astype(jnp.result_type(scale))
  return (*grads, d_scale, None)


_xl_attention.defvjp(_xl_attention_fwd, _xl_attention_bwd)


def xl_attention(q_u: jax.Array, q_v: jax.Array, k: jax.Array, v: jax.Array, r: jax.Array,
                 scale, mem_valid, *, interpret: bool | None = None,
                 tiles: XLTiles = XLTiles()) -> jax.Array:
  """The fused XL attention (module docstring); differentiable in q_u, q_v, k, v, r and a
  traced scale. interpret: None runs the Triton kernels when tracing for a GPU, interpret
  mode elsewhere; tiles: each kernel's, by default `xl_blocks`' rule."""
  if interpret is None:
    interpret = not backends.targets_gpu()
  if not isinstance(scale, jax.Array):
    scale = jnp.asarray(scale, jnp.float32)
  mem_valid = jnp.asarray(mem_valid, jnp.int32)
  head_dim = q_u.shape[-1]
  width = aligned_width(head_dim, q_u.dtype)
  q_u, q_v, k, v, r = (zero_pad(x, width) for x in (q_u, q_v, k, v, r))
  out = _xl_attention(q_u, q_v, k, v, r, scale, mem_valid, interpret, tiles)
  return out[..., :head_dim]
