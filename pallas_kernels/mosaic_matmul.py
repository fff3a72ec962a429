"""Pallas Mosaic GPU (Hopper) kernel: rows sorted by expert times their expert's weights.

    out[r] = x[r] @ w[e(r)]        w [E, K, N]   (forward)
    out[r] = x[r] @ w[e(r)]^T      w [E, N, K]   (input gradient: no transposed copy of w)

x [S, K] holds the rows grouped by expert, out [S, N]. The work list is the XLA-built
`slot_layout.SegmentTable` (runs of one expert's rows inside one `rows`-row tile) times the
`cols`-wide column tiles of the output. A persistent grid (one program per SM) walks that
list; each item streams its row tile and its expert's weight tiles into shared memory by TMA
in a software pipeline over K (`stages` steps in flight) and multiplies them with wgmma into
an f32 accumulator in registers. A tile holds the rows of several segments, so the result is
written back only for the segment's rows: TMA stores need static box sizes, so the row count
is split into its binary digits and one store of 2^i rows is issued per set bit.

There is no interpret mode for wgmma or TMA: numerics are tested on a GPU only; on CPU the
tests check that the kernel lowers for an abstract H100.
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from pallas_kernels import slot_layout

DTYPES = ("bfloat16", "float16")
TILE_MULTIPLE = 64  # K and N must be multiples of it (128-byte swizzled 16-bit tiles).
# TMA copies tiles of rows only from arrays whose row count is under or a multiple of 8 (an
# H200 refused 70 and 260 rows), so the kernels' row arrays are padded to one.
ROW_MULTIPLE = 8
_H100_SMS = 132


@dataclasses.dataclass(frozen=True)
class MatmulBlocks:
  """One work item: `rows` x `cols` output tile, K consumed `inner` columns per pipeline
  step with `stages` steps in flight. rows is a multiple of 64 (one wgmma's M)."""
  rows: int
  cols: int
  inner: int
  stages: int


def check_problem(dtype, **sizes: int) -> None:
  """Raise a ValueError unless the dtype is 16-bit and every size a multiple of 64."""
  if jnp.dtype(dtype).name not in DTYPES:
    raise ValueError(f"impl='mosaic' multiplies {DTYPES} (wgmma); got {jnp.dtype(dtype).name}:"
                     " use impl='pallas' for float32")
  for name, size in sizes.items():
    if size % TILE_MULTIPLE:
      raise ValueError(f"impl='mosaic' needs {name} to be a multiple of {TILE_MULTIPLE}, got "
                       f"{size}: use impl='pallas' for this shape")


def check_tiles(blocks, **size_and_field: tuple[int, str]) -> None:
  """Raise a ValueError unless each tile field of `blocks` divides its size: the kernels
  loop over size // tile tiles, so a tile that does not divide would leave outputs unwritten
  (a 256-wide tile on N = 128 ran as no work at all)."""
  for name, (size, field) in size_and_field.items():
    tile = getattr(blocks, field)
    if size % tile:
      raise ValueError(f"blocks.{field}={tile} must divide {name}={size}")


def padded_rows(num_rows: int, tile_rows: int) -> int:
  """Rows of the kernels' row arrays: a multiple of ROW_MULTIPLE, and at least one tile (a
  tile may not be larger than its array). The padding rows are in no expert's group."""
  return max(slot_layout.cdiv(num_rows, ROW_MULTIPLE) * ROW_MULTIPLE, tile_rows)


def matmul_blocks(k: int, n: int) -> MatmulBlocks:
  """128 x 128 output tiles (64 wide when N is not a multiple of 128), 64-column K steps,
  4 in flight: about 128 KiB of shared memory. Not tuned on a GPU yet."""
  del k  # Any multiple of 64 works with 64-column steps.
  return MatmulBlocks(rows=128, cols=128 if n % 128 == 0 else 64, inner=64, stages=4)


def num_sms() -> int:
  """SMs of the device traced for: the abstract GPU's (lowering on CPU) or the real one's."""
  mesh = jax.sharding.get_abstract_mesh()
  device = None if mesh.empty else mesh.abstract_device
  cores = getattr(device, "num_cores", None)
  if cores is None and jax.default_backend() == "gpu":
    cores = getattr(jax.local_devices()[0], "core_count", None)
  return cores or _H100_SMS


def compiler_params():
  """Warpgroup semantics: the kernel body is written for one warpgroup (wgmma's unit)."""
  return plgpu.CompilerParams(lowering_semantics=plgpu.LoweringSemantics.Warpgroup)


def store_rows(tile_rc: jax.Array, out_ref, *, first_row, offset, count, col_slice) -> None:
  """out[first_row + offset + i, col_slice] = tile[offset + i] for i < count (<= rows).

  TMA boxes are static, so the dynamic `count` is written as one store per set bit of its
  binary representation (largest first), each of a power-of-2 number of rows.
  """
  rows = tile_rc.shape[0]

  def scope(tile_smem):
    tile_smem[...] = tile_rc.astype(tile_smem.dtype)
    plgpu.commit_smem()
    done = offset
    size = rows
    while size >= 1:
      chunk = size

      @pl.when((count & chunk) != 0)
      def _():
        plgpu.copy_smem_to_gmem(tile_smem.at[pl.ds(done, chunk)],
                                out_ref.at[pl.ds(first_row + done, chunk), col_slice])

      done = done + (count & chunk)
      size //= 2
    plgpu.wait_smem_to_gmem(0, wait_read_only=True)

  pl.run_scoped(scope, plgpu.SMEM(tile_rc.shape, out_ref.dtype))


def _segment_matmul_body(starts_ref, ends_ref, experts_ref, x_ref, w_ref, out_ref, *,
                         blocks: MatmulBlocks, transpose_w: bool):
  """The persistent program: items are (segment, column tile), segment-major so that
  consecutive items reuse one row tile from L2."""
  num_segments = starts_ref.shape[0]
  size_k = x_ref.shape[1]
  num_col_tiles = out_ref.shape[1] // blocks.cols

  @plgpu.nd_loop((num_segments * num_col_tiles,), collective_axes="sm")
  def _(loop_info):
    segment = lax.div(loop_info.index[0], num_col_tiles)
    col_tile = lax.rem(loop_info.index[0], num_col_tiles)
    start, end, expert = starts_ref[segment], ends_ref[segment], experts_ref[segment]
    row_tile = lax.div(start, blocks.rows)

    @pl.when(start < end)
    def _():
      def multiply(acc_ref):
        w_spec = (plgpu.BlockSpec((blocks.cols, blocks.inner), lambda i: (col_tile, i),
                                  delay_release=1) if transpose_w else
                  plgpu.BlockSpec((blocks.inner, blocks.cols), lambda i: (i, col_tile),
                                  delay_release=1))
        plgpu.emit_pipeline(
            lambda _, x_smem, w_smem: plgpu.wgmma(
                acc_ref, x_smem, plgpu.transpose_ref(w_smem, (1, 0)) if transpose_w else w_smem),
            grid=(size_k // blocks.inner,),
            in_specs=[plgpu.BlockSpec((blocks.rows, blocks.inner), lambda i: (row_tile, i),
                                      delay_release=1), w_spec],
            max_concurrent_steps=blocks.stages,
        )(x_ref, w_ref.at[expert])
        return acc_ref[...]

      acc_rc = pl.run_scoped(multiply, plgpu.ACC((blocks.rows, blocks.cols)))
      store_rows(acc_rc, out_ref, first_row=row_tile * blocks.rows,
                 offset=start - row_tile * blocks.rows, count=end - start,
                 col_slice=pl.ds(col_tile * blocks.cols, blocks.cols))


@functools.partial(jax.jit, static_argnames=("transpose_w", "out_dtype", "blocks"))
def segment_matmul(x_sk: jax.Array, w: jax.Array, groups: slot_layout.ExpertGroups, *,
                   transpose_w: bool, out_dtype, blocks: MatmulBlocks | None = None) -> jax.Array:
  """out[S, N] = x[r] @ w[e(r)] (w [E, K, N]) or x[r] @ w[e(r)]^T (w [E, N, K], transpose_w)
  for rows grouped by expert as `groups` says (tiles: `blocks`, default `matmul_blocks`)."""
  num_rows, size_k = x_sk.shape
  size_n = w.shape[1] if transpose_w else w.shape[2]
  check_problem(x_sk.dtype, K=size_k, N=size_n)
  blocks = blocks or matmul_blocks(size_k, size_n)
  check_tiles(blocks, K=(size_k, "inner"), N=(size_n, "cols"))
  num_padded = padded_rows(num_rows, blocks.rows)
  x_sk = jnp.pad(x_sk, ((0, num_padded - num_rows), (0, 0)))
  table = slot_layout.segment_table(groups, num_rows, blocks.rows)
  kernel = plgpu.kernel(
      functools.partial(_segment_matmul_body, blocks=blocks, transpose_w=transpose_w),
      out_type=jax.ShapeDtypeStruct((num_padded, size_n), out_dtype),
      grid=(num_sms(),),
      grid_names=("sm",),
      compiler_params=compiler_params(),
  )
  return kernel(table.starts_p, table.ends_p, table.experts_p, x_sk, w)[:num_rows]
