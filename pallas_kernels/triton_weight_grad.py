"""Pallas Triton kernel: the CVMM weight gradient, one expert per program row.

    dw[e] = x_e^T @ dy_e      x [S, M], dy [S, L] rows grouped by expert, dw [E, M, L]

The grid is (expert, M tile, L tile); each program loops over its expert's rows
`inner` at a time (a data-dependent trip count) and writes its tile once. Nothing is
shared between programs, so the result is deterministic without atomics (the reference
kernel uses atomic adds), and an expert with no rows runs zero iterations: a zero gradient.

Either operand may be given as `slot_layout.IndexedRows`, a source read through the index
of each row (`triton_matmul.load_rows`): the up projection's weight gradient then reads the
token rows that k slots share, and cvmm's the gated cotangent (g * dy, the gate applied to
each loaded row), without an [S, ...] copy of them (ScatterMoE's gather in the loads; see
`triton_matmul`). Each step loads the `inner` indices of its rows, then the rows through them.
Compiled for an H100 and an A100 on CPU (ptxas -v, expert_mlp at d 256, G 128): no spills,
but the gathering variants hold more registers than the plain ones did, in float32 126-188
per thread on sm_90 and 184-232 on sm_80 (plain: 96 and 85), in bf16 154-158 on sm_90
(plain: 158-160) and 212-236 on sm_80 (plain: 208). Their speed is unmeasured (no GPU yet).
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from pallas_kernels import slot_layout
from pallas_kernels.triton_matmul import (RowsForm, dot_precision, load_rows, pow2_block,
                                          row_inputs, take_row_refs, triton_compiler_params)


@dataclasses.dataclass(frozen=True)
class WeightGradBlocks:
  """Tiles of one program: dW[e] tile [rows_m, cols], accumulated over the expert's rows
  `inner` rows at a time."""
  rows_m: int
  cols: int
  inner: int
  num_warps: int = 4
  num_stages: int = 3


def weight_grad_blocks(num_rows: int, m: int, l: int, dtype) -> WeightGradBlocks:
  """Tiles for dW[e][M, L] = x_e^T @ dy_e. 16-bit: 128 x 128 tiles, 32 slot rows per step,
  the best of `benchmarks/tune_blocks.py`'s grid on both the H200 and the H100 runs (sum of
  the two projections 27% and 12% below the earlier 64 x 128 x 64; benchmarks/RESULTS.md).
  float32 (not tuned on a GPU yet): 64 x 64 tiles, 32 rows per step."""
  if jnp.dtype(dtype).itemsize >= 4:
    return WeightGradBlocks(rows_m=pow2_block(64, m), cols=pow2_block(64, l),
                            inner=pow2_block(32, num_rows))
  return WeightGradBlocks(rows_m=pow2_block(128, m), cols=pow2_block(128, l),
                          inner=pow2_block(32, num_rows))


def _weight_grad_kernel(starts_ref, sizes_ref, *refs, blocks: WeightGradBlocks,
                        x_form: RowsForm, dy_form: RowsForm):
  """One program: dw[expert][m tile, l tile] = sum over the expert's rows of x^T dy."""
  refs = list(refs)
  x_rows = take_row_refs(refs, x_form)
  dy_rows = take_row_refs(refs, dy_form)
  dw_ref, = refs
  expert, m_tile, l_tile = pl.program_id(0), pl.program_id(1), pl.program_id(2)
  start, size = starts_ref[expert], sizes_ref[expert]
  size_m, size_l = x_rows.source.shape[1], dy_rows.source.shape[1]
  m_cols = m_tile * blocks.rows_m + jnp.arange(blocks.rows_m)
  l_cols = l_tile * blocks.cols + jnp.arange(blocks.cols)
  m_mask, l_mask = m_cols < size_m, l_cols < size_l

  def accumulate(step, acc_ml):
    row0 = start + step * blocks.inner
    row_mask = step * blocks.inner + jnp.arange(blocks.inner) < size
    x_im = load_rows(x_rows, row0, blocks.inner, row_mask, m_tile * blocks.rows_m,
                     blocks.rows_m, m_mask)
    dy_il = load_rows(dy_rows, row0, blocks.inner, row_mask, l_tile * blocks.cols, blocks.cols,
                      l_mask)
    return acc_ml + jnp.dot(x_im.T, dy_il, precision=dot_precision(x_im.dtype),
                            preferred_element_type=jnp.float32)

  acc_ml = lax.fori_loop(0, pl.cdiv(size, blocks.inner), accumulate,
                         jnp.zeros((blocks.rows_m, blocks.cols), jnp.float32))
  plgpu.store(dw_ref.at[expert, pl.ds(m_tile * blocks.rows_m, blocks.rows_m),
                        pl.ds(l_tile * blocks.cols, blocks.cols)],
              acc_ml.astype(dw_ref.dtype), mask=m_mask[:, None] & l_mask[None, :])


@functools.partial(jax.jit, static_argnames=("out_dtype", "interpret", "blocks"))
def weight_grad(x_sm, dy_sl, groups: slot_layout.ExpertGroups, *, out_dtype, interpret: bool,
                blocks: WeightGradBlocks | None = None) -> jax.Array:
  """dw[E, M, L] from rows grouped by expert (`groups`); zero for experts without rows
  (tiles: `blocks`, default `weight_grad_blocks`).

  x_sm, dy_sl: the [S, M] and [S, L] rows, or either as `slot_layout.IndexedRows` (a source
  read through the index of each row inside the kernel, no [S, ...] copy made).
  """
  x_form, x_inputs, num_rows = row_inputs(x_sm)
  dy_form, dy_inputs, _ = row_inputs(dy_sl)
  size_m, size_l = x_inputs[-1].shape[1], dy_inputs[-1].shape[1]
  num_experts = groups.starts_e.shape[0]
  blocks = blocks or weight_grad_blocks(num_rows, size_m, size_l, x_inputs[-1].dtype)
  return pl.pallas_call(
      functools.partial(_weight_grad_kernel, blocks=blocks, x_form=x_form, dy_form=dy_form),
      out_shape=jax.ShapeDtypeStruct((num_experts, size_m, size_l), out_dtype),
      grid=(num_experts, pl.cdiv(size_m, blocks.rows_m), pl.cdiv(size_l, blocks.cols)),
      compiler_params=triton_compiler_params(blocks.num_warps, blocks.num_stages),
      interpret=interpret,
      name="cvmm_weight_grad",
  )(groups.starts_e, groups.sizes_e, *x_inputs, *dy_inputs)
