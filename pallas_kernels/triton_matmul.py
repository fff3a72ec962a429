"""Pallas Triton kernel: rows sorted by expert times their expert's weight matrix.

    out[r] = x[r] @ w[e(r)]      x [S, M] rows grouped by expert, w [E, M, L], out [S, L]
    out[r] = x[i[r]] @ w[e(r)]   the same with x given as IndexedRows: x [N, M] in token order

Used for the CVMM forward pass and, on the transposed weights, for the input gradient.
The grid is (segment, column tile). A segment (slot_layout.SegmentTable) is a run of rows of a
single expert inside one `rows`-row tile, so a program loads one row tile and loops over the
contracted dimension M with weight tiles of exactly one expert, unlike the reference kernel,
which loops over every expert id a tile straddles. Tables are ordinary inputs (scalar
prefetch is TPU-only); rows, columns and M are masked, so no size has to be a power of 2.
Block sizes come from `matmul_blocks` below, a rule on (rows, M, L, dtype) passed to the
kernel as static arguments; it has not been tuned on a GPU yet.

Row gather in the loads. x may be given as `slot_layout.IndexedRows`: an [N, M] source and the
source row of each of the S rows (optionally a scale per row). A program then loads its tile's
indices once (one int32 per row) and reads every x tile through them: a Triton load whose row
offsets come from that vector, so each row of a tile is still one contiguous run of M. This is
ScatterMoE's idea (Tan et al. 2024, shawntan/scattermoe: sort the indices, never the data):
the up projection's input, the token rows that k slots share, is never copied into an [N*k, M]
array in expert order by XLA (issue 59 found a third of the up projection forward's time on an
H200 outside the kernel: this copy, the layout and the gated gather-sum). Written here from
that description; no code is taken from it. What it saves on a GPU has not been measured yet:
no GPU was lent when it was written. The load uses an integer array on both axes (rows x
columns), the indexer that both the Triton lowering and interpret mode's discharge accept in
JAX 0.10.2 (interpret mode refuses an array index mixed with a `pl.ds` slice).
"""

import dataclasses
import functools
from typing import Any, NamedTuple

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


@dataclasses.dataclass(frozen=True)
class RowsForm:
  """How a row operand reaches a kernel (static): the rows themselves, or a source read
  through an index (`gathered`), each row optionally times a scale (`scaled`)."""
  gathered: bool = False
  scaled: bool = False


class RowRefs(NamedTuple):
  """A kernel's refs of one row operand; index and scale are None unless its form has them."""
  source: Any
  index: Any = None
  scale: Any = None


def row_inputs(rows) -> tuple[RowsForm, list[jax.Array], int]:
  """(form, pallas_call inputs in the order `take_row_refs` reads them, number of rows) of a
  row operand: an [R, D] array, or `slot_layout.IndexedRows` (no copy of its source)."""
  if not isinstance(rows, slot_layout.IndexedRows):
    return RowsForm(), [rows], rows.shape[0]
  scaled = rows.scale_r is not None
  inputs = [rows.index_r.astype(jnp.int32)]
  inputs += [rows.scale_r.astype(jnp.float32)] if scaled else []
  return RowsForm(gathered=True, scaled=scaled), [*inputs, rows.source], rows.index_r.shape[0]


def take_row_refs(refs: list, form: RowsForm) -> RowRefs:
  """Pop one row operand's refs (as `row_inputs` ordered them) from the front of `refs`."""
  index = refs.pop(0) if form.gathered else None
  scale = refs.pop(0) if form.scaled else None
  return RowRefs(refs.pop(0), index, scale)


def load_rows(rows: RowRefs, row0, num_rows: int, row_mask, col0, num_cols: int, col_mask):
  """The [num_rows, num_cols] tile at (row0, col0) of a row operand, zeros where masked: rows
  row0 .. row0 + num_rows of the source, or, for a gathered operand, those rows' indices and
  scales first, then the source rows through them (`load_rows_at`)."""
  if rows.index is None:
    return plgpu.load(rows.source.at[pl.ds(row0, num_rows), pl.ds(col0, num_cols)],
                      mask=row_mask[:, None] & col_mask[None, :], other=0.0)
  source_r, scale_r = load_row_index(rows, row0, num_rows, row_mask)
  return load_rows_at(rows.source, source_r, scale_r, row_mask, col0, num_cols, col_mask)


def load_row_index(rows: RowRefs, row0, num_rows: int, row_mask):
  """The source row index (and the scale, None without one) of rows row0 .. row0 + num_rows."""
  source_r = plgpu.load(rows.index.at[pl.ds(row0, num_rows)], mask=row_mask, other=0)
  scale_r = None if rows.scale is None else plgpu.load(
      rows.scale.at[pl.ds(row0, num_rows)], mask=row_mask, other=0.0)
  return source_r, scale_r


def load_rows_at(x_ref, source_r, scale_r, row_mask, col0, num_cols: int, col_mask):
  """x[source_r[r], col0 : col0 + num_cols] (times scale_r[r], rounded back to x's dtype) for
  every row r of a tile; zeros where masked or where source_r[r] is past x's rows (padding).

  One load with an integer array on both axes: each row's columns are still contiguous.
  """
  row_mask = row_mask & (source_r >= 0) & (source_r < x_ref.shape[0])
  cols_c = col0 + jnp.arange(num_cols)
  tile = plgpu.load(x_ref.at[jnp.where(row_mask, source_r, 0)[:, None], cols_c[None, :]],
                    mask=row_mask[:, None] & col_mask[None, :], other=0.0)
  if scale_r is None:
    return tile
  return (tile.astype(jnp.float32) * scale_r[:, None]).astype(tile.dtype)


def _segment_matmul_kernel(starts_ref, ends_ref, experts_ref, *refs, blocks: MatmulBlocks,
                           form: RowsForm):
  """One program: out[start:end, col tile] = x[start:end] @ w[expert][:, col tile]
  (x's rows read through their index when `form` is gathered)."""
  refs = list(refs)
  x_rows = take_row_refs(refs, form)
  w_ref, out_ref = refs
  x_ref = x_rows.source
  segment, col_tile = pl.program_id(0), pl.program_id(1)
  start, end, expert = starts_ref[segment], ends_ref[segment], experts_ref[segment]
  size_m, size_l = x_ref.shape[1], w_ref.shape[2]
  rows_r = start + jnp.arange(blocks.rows)
  cols_c = col_tile * blocks.cols + jnp.arange(blocks.cols)
  row_mask_r = rows_r < end
  col_mask_c = cols_c < size_l

  @pl.when(start < end)
  def _():
    if form.gathered:  # The tile's source rows (and scales), loaded once for the loop over M.
      source_r, scale_r = load_row_index(x_rows, start, blocks.rows, row_mask_r)

    def accumulate(step, acc_rc):
      inner_i = step * blocks.inner + jnp.arange(blocks.inner)
      inner_mask_i = inner_i < size_m
      if form.gathered:
        x_ri = load_rows_at(x_ref, source_r, scale_r, row_mask_r, step * blocks.inner,
                            blocks.inner, inner_mask_i)
      else:
        x_ri = load_rows(x_rows, start, blocks.rows, row_mask_r, step * blocks.inner,
                         blocks.inner, inner_mask_i)
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
def segment_matmul(x_sm, w_eml: jax.Array, groups: slot_layout.ExpertGroups, *, out_dtype,
                   interpret: bool, blocks: MatmulBlocks | None = None) -> jax.Array:
  """out[S, L] = x[r] @ w[expert of row r] for rows grouped by expert as `groups` says
  (tiles: `blocks`, default `matmul_blocks`).

  x_sm: the [S, M] rows, or `slot_layout.IndexedRows` (an [N, M] source, e.g. the token rows
  k slots share, and the [S] index of each row): the kernel then reads row r as
  source[index[r]] in its loads, and no [S, M] copy is made.
  """
  form, x_inputs, num_rows = row_inputs(x_sm)
  source = x_inputs[-1]
  size_m, size_l = source.shape[1], w_eml.shape[2]
  blocks = blocks or matmul_blocks(num_rows, size_m, size_l, source.dtype)
  table = slot_layout.segment_table(groups, num_rows, blocks.rows)
  return pl.pallas_call(
      functools.partial(_segment_matmul_kernel, blocks=blocks, form=form),
      out_shape=jax.ShapeDtypeStruct((num_rows, size_l), out_dtype),
      grid=(table.starts_p.shape[0], pl.cdiv(size_l, blocks.cols)),
      compiler_params=triton_compiler_params(blocks.num_warps, blocks.num_stages),
      interpret=interpret,
      name="cvmm_segment_matmul",
  )(table.starts_p, table.ends_p, table.experts_p, *x_inputs, w_eml)
