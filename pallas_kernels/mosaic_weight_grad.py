"""Pallas Mosaic GPU (Hopper) kernel: the CVMM weight gradient.

    dw[e] = x_e^T @ dy_e      x [S, M], dy [S, L] rows grouped by expert, dw [E, M, L]

A persistent grid walks the (expert, M tile, L tile) items. Each item streams its expert's
rows `inner` at a time (blocks aligned to the array, so the first and last block of an expert
may hold rows of its neighbours) through a TMA pipeline and accumulates x_tile^T @ dy_tile
with wgmma. Rows of the neighbours are zeroed in the x tile in shared memory before the
multiply, only in those two boundary blocks. Every item writes its tile once (no atomics, so
the result is deterministic); an expert without rows writes zeros.

Numerics are tested on a GPU only (no interpret mode for wgmma/TMA); on CPU the tests check
the lowering for an abstract H100.
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from pallas_kernels import slot_layout
from pallas_kernels.mosaic_matmul import check_problem, check_tiles, compiler_params, num_sms
from pallas_kernels.mosaic_matmul import padded_rows


@dataclasses.dataclass(frozen=True)
class WeightGradBlocks:
  """One work item: dw tile [rows_m, cols], the expert's rows consumed `inner` at a time
  with `stages` pipeline steps in flight."""
  rows_m: int
  cols: int
  inner: int
  stages: int


def weight_grad_blocks(m: int, l: int) -> WeightGradBlocks:
  """128 x 128 tiles (64 where M or L is not a multiple of 128), 64 rows per step, 4 in
  flight. Not tuned on a GPU yet."""
  return WeightGradBlocks(rows_m=128 if m % 128 == 0 else 64,
                          cols=128 if l % 128 == 0 else 64, inner=64, stages=4)


def _swizzled(minor: int, dtype) -> tuple:
  """Shared-memory transforms (8-row tiles, widest swizzle) of a tile with `minor` columns."""
  bits = jnp.finfo(dtype).bits
  swizzle = plgpu.find_swizzle(minor * bits)
  return plgpu.TilingTransform((8, swizzle * 8 // bits)), plgpu.SwizzleTransform(swizzle)


def _zero_foreign_rows(x_smem, block_start, start, end) -> None:
  """Zero the rows of the [inner, rows_m] x tile (array rows from block_start) outside
  [start, end): they belong to the neighbouring experts."""
  rows = lax.broadcasted_iota(jnp.int32, x_smem.shape, 0) + block_start
  mine = plgpu.layout_cast((rows >= start) & (rows < end), plgpu.Layout.WGMMA)
  x_smem[...] = jnp.where(mine, x_smem[...], jnp.zeros((), x_smem.dtype))
  plgpu.commit_smem()


def _weight_grad_body(starts_ref, sizes_ref, x_ref, dy_ref, dw_ref, *, blocks: WeightGradBlocks):
  """The persistent program over (expert, M tile, L tile) items."""
  num_experts, size_m, size_l = dw_ref.shape
  m_tiles, l_tiles = size_m // blocks.rows_m, size_l // blocks.cols
  x_transforms = _swizzled(blocks.rows_m, x_ref.dtype)
  dy_transforms = _swizzled(blocks.cols, dy_ref.dtype)

  @plgpu.nd_loop((num_experts, m_tiles * l_tiles), collective_axes="sm")
  def _(loop_info):
    expert, tile = loop_info.index
    m_tile, l_tile = lax.div(tile, l_tiles), lax.rem(tile, l_tiles)
    start = starts_ref[expert]
    end = start + sizes_ref[expert]
    first_block = lax.div(start, blocks.inner)
    num_blocks = lax.div(end + blocks.inner - 1, blocks.inner) - first_block

    def accumulate(acc_ref):
      def step(indices, x_smem, dy_smem):
        block = indices[0]

        @pl.when((block == 0) | (block == num_blocks - 1))
        def _():
          _zero_foreign_rows(x_smem, (first_block + block) * blocks.inner, start, end)

        plgpu.wgmma(acc_ref, plgpu.transpose_ref(x_smem, (1, 0)), dy_smem)

      @pl.when(end > start)
      def _():
        plgpu.emit_pipeline(
            step,
            grid=(num_blocks,),
            in_specs=[
                plgpu.BlockSpec((blocks.inner, blocks.rows_m), lambda b: (first_block + b, m_tile),
                                delay_release=1, transforms=x_transforms),
                plgpu.BlockSpec((blocks.inner, blocks.cols), lambda b: (first_block + b, l_tile),
                                delay_release=1, transforms=dy_transforms),
            ],
            max_concurrent_steps=blocks.stages,
        )(x_ref, dy_ref)

      return acc_ref[...]

    acc_ml = pl.run_scoped(accumulate, plgpu.ACC((blocks.rows_m, blocks.cols)))

    def store(dw_smem):
      dw_smem[...] = acc_ml.astype(dw_smem.dtype)
      plgpu.commit_smem()
      plgpu.copy_smem_to_gmem(dw_smem, dw_ref.at[expert, pl.ds(m_tile * blocks.rows_m, blocks.rows_m),
                                                 pl.ds(l_tile * blocks.cols, blocks.cols)])
      plgpu.wait_smem_to_gmem(0, wait_read_only=True)

    pl.run_scoped(store, plgpu.SMEM((blocks.rows_m, blocks.cols), dw_ref.dtype,
                                    transforms=_swizzled(blocks.cols, dw_ref.dtype)))


@functools.partial(jax.jit, static_argnames=("out_dtype", "blocks"))
def weight_grad(x_sm: jax.Array, dy_sl: jax.Array, groups: slot_layout.ExpertGroups, *,
                out_dtype, blocks: WeightGradBlocks | None = None) -> jax.Array:
  """dw[E, M, L] from rows grouped by expert (`groups`); zero for experts without rows
  (tiles: `blocks`, default `weight_grad_blocks`)."""
  num_rows, size_m = x_sm.shape
  size_l = dy_sl.shape[1]
  check_problem(x_sm.dtype, M=size_m, L=size_l)
  blocks = blocks or weight_grad_blocks(size_m, size_l)
  check_tiles(blocks, M=(size_m, "rows_m"), L=(size_l, "cols"))
  num_padded = padded_rows(num_rows, blocks.inner)
  x_sm = jnp.pad(x_sm, ((0, num_padded - num_rows), (0, 0)))
  dy_sl = jnp.pad(dy_sl, ((0, num_padded - num_rows), (0, 0)))
  kernel = plgpu.kernel(
      functools.partial(_weight_grad_body, blocks=blocks),
      out_type=jax.ShapeDtypeStruct((groups.starts_e.shape[0], size_m, size_l), out_dtype),
      grid=(num_sms(),),
      grid_names=("sm",),
      compiler_params=compiler_params(),
  )
  return kernel(groups.starts_e, groups.sizes_e, x_sm, dy_sl)
