"""Pallas (Triton) kernel: the CVMM weight gradient, one expert per program row.

    dw[e] = x_e^T @ dy_e      x [S, M], dy [S, L] rows grouped by expert, dw [E, M, L]

The grid is (expert, M tile, L tile); each program loops over its expert's rows
`inner` at a time (a data-dependent trip count) and writes its tile once. Nothing is
shared between programs, so the result is deterministic without atomics (the reference
kernel uses atomic adds), and an expert with no rows runs zero iterations: a zero gradient.
"""

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from pallas_kernels import block_table
from pallas_kernels import dispatch
from pallas_kernels.forward_kernel import dot_precision, triton_compiler_params


def _weight_grad_kernel(starts_ref, sizes_ref, x_ref, dy_ref, dw_ref, *,
                        blocks: block_table.WeightGradBlocks):
  """One program: dw[expert][m tile, l tile] = sum over the expert's rows of x^T dy."""
  expert, m_tile, l_tile = pl.program_id(0), pl.program_id(1), pl.program_id(2)
  start, size = starts_ref[expert], sizes_ref[expert]
  size_m, size_l = x_ref.shape[1], dy_ref.shape[1]
  m_cols = m_tile * blocks.rows_m + jnp.arange(blocks.rows_m)
  l_cols = l_tile * blocks.cols + jnp.arange(blocks.cols)
  m_mask, l_mask = m_cols < size_m, l_cols < size_l

  def accumulate(step, acc_ml):
    row0 = start + step * blocks.inner
    row_mask = step * blocks.inner + jnp.arange(blocks.inner) < size
    x_im = plgpu.load(x_ref.at[pl.ds(row0, blocks.inner), pl.ds(m_tile * blocks.rows_m, blocks.rows_m)],
                      mask=row_mask[:, None] & m_mask[None, :], other=0.0)
    dy_il = plgpu.load(dy_ref.at[pl.ds(row0, blocks.inner), pl.ds(l_tile * blocks.cols, blocks.cols)],
                       mask=row_mask[:, None] & l_mask[None, :], other=0.0)
    return acc_ml + jnp.dot(x_im.T, dy_il, precision=dot_precision(x_im.dtype),
                            preferred_element_type=jnp.float32)

  acc_ml = lax.fori_loop(0, pl.cdiv(size, blocks.inner), accumulate,
                         jnp.zeros((blocks.rows_m, blocks.cols), jnp.float32))
  plgpu.store(dw_ref.at[expert, pl.ds(m_tile * blocks.rows_m, blocks.rows_m),
                        pl.ds(l_tile * blocks.cols, blocks.cols)],
              acc_ml.astype(dw_ref.dtype), mask=m_mask[:, None] & l_mask[None, :])


@functools.partial(jax.jit, static_argnames=("out_dtype", "interpret"))
def weight_grad(x_sm: jax.Array, dy_sl: jax.Array, groups: dispatch.ExpertGroups, *,
                out_dtype, interpret: bool) -> jax.Array:
  """dw[E, M, L] from rows grouped by expert (`groups`); zero for experts without rows."""
  num_rows, size_m = x_sm.shape
  size_l = dy_sl.shape[1]
  num_experts = groups.starts_e.shape[0]
  blocks = block_table.weight_grad_blocks(num_rows, size_m, size_l, x_sm.dtype)
  return pl.pallas_call(
      functools.partial(_weight_grad_kernel, blocks=blocks),
      out_shape=jax.ShapeDtypeStruct((num_experts, size_m, size_l), out_dtype),
      grid=(num_experts, pl.cdiv(size_m, blocks.rows_m), pl.cdiv(size_l, blocks.cols)),
      compiler_params=triton_compiler_params(blocks.num_warps, blocks.num_stages),
      interpret=interpret,
      name="cvmm_weight_grad",
  )(groups.starts_e, groups.sizes_e, x_sm, dy_sl)
