"""Pallas Triton kernel: rows sorted by expert times their expert's weight matrix.

    out[r] = x[r] @ w[e(r)]      x [S, M] rows grouped by expert, w [E, M, L], out [S, L]

Used for the CVMM forward pass and, on the transposed weights, for the input gradient.
The grid is (segment, column tile). A segment (slot_layout.SegmentTable) is a run of rows of a
single expert inside one `rows`-row tile, so a program loads one row tile and loops over the
contracted dimension M with weight tiles of exactly one expert, unlike the reference kernel,
which loops over every expert id a tile straddles. Tables are ordinary inputs (scalar
prefetch is TPU-only); rows, columns and M are masked, so no size has to be a power of 2.
Block sizes come from `matmul_blocks` below, a rule on (rows, M, L, dtype) passed to the
kernel as static arguments; it has not been tuned on a GPU yet.
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from pallas_kernels import slot_layout

_MIN_DOT_BLOCK = 16  # Triton's tl.dot needs power-of-2 operands of at least 16.


@dataclasses.dataclass(frozen=True)
class MatmulBlocks:
  """Tiles of one program: `rows` sorted rows (the tile a segment lives in) by `cols` output
  columns, looping over the contracted dimension `inner` columns at a time."""
  rows: int
  cols: int
  inner: int
  num_warps: int = 4
  num_stages: int = 3


def pow2_block(block: int, extent: int) -> int:
  """`block`, shrunk to the smallest power of 2 >= max(extent, 16) when the problem is
  smaller, so tiny test shapes stay cheap."""
  covering = _MIN_DOT_BLOCK
  while covering < extent:
    covering *= 2
  return min(block, covering)


def matmul_blocks(num_rows: int, m: int, l: int, dtype) -> MatmulBlocks:
  """Tiles for out[S, L] = x[S, M] @ w[e][M, L]: 64 rows; 128 x 64 (16-bit) or 64 x 32
  (f32, whose tiles take twice the shared memory) output columns x contracted columns."""
  wide = jnp.dtype(dtype).itemsize >= 4
  return MatmulBlocks(rows=pow2_block(64, num_rows), cols=pow2_block(64 if wide else 128, l),
                      inner=pow2_block(32 if wide else 64, m))


def triton_compiler_params(num_warps: int, num_stages: int):
  """Triton `CompilerParams` (named `TritonCompilerParams` in older JAX releases).

  Passing them explicitly routes `pallas_call` to the Triton backend on every JAX version.
  """
  params_cls = getattr(plgpu, "CompilerParams", None) or getattr(plgpu, "TritonCompilerParams")
  return params_cls(num_warps=num_warps, num_stages=num_stages)


def dot_precision(dtype) -> lax.Precision:
  """f32 tiles multiply in IEEE f32 (Triton would use TF32 by default); bf16 is exact anyway."""
  return lax.Precision.HIGHEST if jnp.dtype(dtype) == jnp.float32 else lax.Precision.DEFAULT


def _segment_matmul_kernel(starts_ref, ends_ref, experts_ref, x_ref, w_ref, out_ref, *,
                           blocks: MatmulBlocks):
  """One program: out[start:end, col tile] = x[start:end] @ w[expert][:, col tile]."""
  segment, col_tile = pl.program_id(0), pl.program_id(1)
  start, end, expert = starts_ref[segment], ends_ref[segment], experts_ref[segment]
  size_m, size_l = x_ref.shape[1], w_ref.shape[2]
  rows_r = start + jnp.arange(blocks.rows)
  cols_c = col_tile * blocks.cols + jnp.arange(blocks.cols)
  row_mask_r = rows_r < end
  col_mask_c = cols_c < size_l

  @pl.when(start < end)
  def _():
    def accumulate(step, acc_rc):
      inner_i = step * blocks.inner + jnp.arange(blocks.inner)
      inner_mask_i = inner_i < size_m
      x_ri = plgpu.load(
          x_ref.at[pl.ds(start, blocks.rows), pl.ds(step * blocks.inner, blocks.inner)],
          mask=row_mask_r[:, None] & inner_mask_i[None, :], other=0.0)
      w_ic = plgpu.load(
          w_ref.at[expert, pl.ds(step * blocks.inner, blocks.inner),
                   pl.ds(col_tile * blocks.cols, blocks.cols)],
          mask=inner_mask_i[:, None] & col_mask_c[None, :], other=0.0)
      return acc_rc + jnp.dot(x_ri, w_ic, precision=dot_precision(x_ri.dtype),
                              preferred_element_type=jnp.float32)

    acc_rc = lax.fori_loop(0, pl.cdiv(size_m, blocks.inner), accumulate,
                           jnp.zeros((blocks.rows, blocks.cols), jnp.float32))
    plgpu.store(out_ref.at[pl.ds(start, blocks.rows), pl.ds(col_tile * blocks.cols, blocks.cols)],
                acc_rc.astype(out_ref.dtype), mask=row_mask_r[:, None] & col_mask_c[None, :])


@functools.partial(jax.jit, static_argnames=("out_dtype", "interpret", "blocks"))
def segment_matmul(x_sm: jax.Array, w_eml: jax.Array, groups: slot_layout.ExpertGroups, *,
                   out_dtype, interpret: bool, blocks: MatmulBlocks | None = None) -> jax.Array:
  """out[S, L] = x[r] @ w[expert of row r] for rows grouped by expert as `groups` says
  (tiles: `blocks`, default `matmul_blocks`)."""
  num_rows, size_m = x_sm.shape
  size_l = w_eml.shape[2]
  blocks = blocks or matmul_blocks(num_rows, size_m, size_l, x_sm.dtype)
  table = slot_layout.segment_table(groups, num_rows, blocks.rows)
  return pl.pallas_call(
      functools.partial(_segment_matmul_kernel, blocks=blocks),
      out_shape=jax.ShapeDtypeStruct((num_rows, size_l), out_dtype),
      grid=(table.starts_p.shape[0], pl.cdiv(size_l, blocks.cols)),
      compiler_params=triton_compiler_params(blocks.num_warps, blocks.num_stages),
      interpret=interpret,
      name="cvmm_segment_matmul",
  )(table.starts_p, table.ends_p, table.experts_p, x_sm, w_eml)
