"""CVMM on TPU with JAX's own grouped matmul, Pallas megablox (impl "megablox", picked by
`auto` on TPU).

Rows come sorted by expert and unpadded (`slot_layout.sorted_layout`: R rows = the slots,
`layout.groups` an `ExpertGroups`), which is the layout megablox multiplies:

    matmul       y_rl = gmm(x_rm, w_eml, sizes_e): y[r] = x[r] @ w[e(r)]
                 transpose: y_rm = gmm(dy_rl, w_eml, sizes_e, transpose_rhs=True), the input
                 gradient dy[r] @ w[e(r)]^T, reading w's tiles transposed (no w^T copy)
    weight_grad  dw_eml = tgmm(x_rm^T, dy_rl, sizes_e): dw[e] = x_e^T @ dy_e; tgmm visits
                 every expert, so experts without rows get zeros

megablox's own custom VJP (`megablox.ops.gmm`) is not used: `cvmm` owns the VJP and calls
the two kernels of `megablox.gmm` directly.

What megablox requires, and what this wrapper pads:
  * Rows: both kernels cut the rows into tiles of tm rows and raise unless the row count is a
    multiple of tm. x_rm and dy_rl get zero rows up to R' = a multiple of tm. The group
    sizes are not changed, so the padding rows (past sum(sizes_e) = R) are in no group:
    gmm never writes their output rows (sliced off here) and tgmm masks them out.
  * M and L (the K and N of each kernel) are not padded: megablox takes a ragged last K or N
    tile (gmm zeroes the K tail of its operands; the out-of-range rows and columns of a
    partial output tile are computed from garbage and never stored), and the Pallas TPU
    lowering takes any block whose last dimension is a multiple of 128, so tk and tn are
    multiples of 128 even when M or L is smaller. JAX's own TPU tests run such partial tiles
    (k 8, n 16 under 128-wide tiles); interpret mode reads out-of-range elements as NaN, so
    the tests here would see any of them leak.
  * dtypes: float32 or bfloat16 inputs (megablox raises for others), int32 group sizes.

Tiling (tm, tk, tn): tm = 128 rows, clamped to R rounded up to 16 (a whole bf16 sublane
tile): megablox visits a row tile once per expert with rows in it, so tiles much taller than
an expert's rows mostly multiply rows they then mask out, while 128 still fills a v5e MXU.
tk and tn are the largest of 512, 256, 128 dividing M and L rounded up to 128, so at most
the last tile is partial; 512-wide tiles take few grid steps and stay far inside VMEM (about
3 MiB double-buffered in float32).

Precision: megablox's dots take no precision argument and read JAX's default matmul
precision when traced, so float32 inputs are traced under "highest" (Mosaic's fp32 contract
precision); bfloat16 products are exact and always accumulate in float32 in its kernels.

`interpret=True` runs the kernels in Pallas interpret mode (on CPU, as the tests do).
"""

import contextlib
import importlib

import jax
import jax.numpy as jnp

from pallas_kernels import slot_layout

# The kernel module: the package's own `gmm` attribute is the custom-VJP op, which shadows
# the `megablox.gmm` submodule holding the `gmm` and `tgmm` kernels.
_kernels = importlib.import_module("jax.experimental.pallas.ops.tpu.megablox.gmm")

_LANES = 128
_SUBLANES = 16
_ROW_TILE = 128
_LANE_TILES = (512, 256, 128)


def matmul(layout: slot_layout.SlotLayout, x_rm: jax.Array, w_eml: jax.Array, *,
           transpose: bool, out_dtype, interpret: bool) -> jax.Array:
  """y[r] = x[r] @ w[e(r)] ([R, L]), or x[r] @ w[e(r)]^T ([R, M]) when `transpose`."""
  rows, size_k = x_rm.shape
  size_n = w_eml.shape[1] if transpose else w_eml.shape[2]
  tm = _row_tile(rows)
  x_pad = _pad_rows(x_rm, _round_up(rows, tm))
  tiling = (tm, _lane_tile(size_k), _lane_tile(size_n))
  with _full_precision(x_rm.dtype):
    y_pad = _kernels.gmm(x_pad, w_eml, layout.groups.sizes_e,
                         preferred_element_type=jnp.dtype(out_dtype), tiling=tiling,
                         transpose_rhs=transpose, interpret=interpret)
  return y_pad[:rows]


def weight_grad(layout: slot_layout.SlotLayout, x_rm: jax.Array, dy_rl: jax.Array, *,
                num_experts: int, out_dtype, interpret: bool) -> jax.Array:
  """dw[e] = x_e^T @ dy_e over each expert's sorted rows: [E, M, L], zeros for empty experts."""
  del num_experts  # tgmm makes one [M, L] block per entry of sizes_e.
  rows, size_m = x_rm.shape
  tm = _row_tile(rows)
  rows_pad = _round_up(rows, tm)
  tiling = (tm, _lane_tile(size_m), _lane_tile(dy_rl.shape[1]))
  with _full_precision(x_rm.dtype):
    # tgmm takes the left operand as [K, rows] and transposes it back itself.
    return _kernels.tgmm(_pad_rows(x_rm, rows_pad).T, _pad_rows(dy_rl, rows_pad),
                         layout.groups.sizes_e, preferred_element_type=jnp.dtype(out_dtype),
                         tiling=tiling, interpret=interpret)


def _full_precision(dtype):
  """Trace megablox's dots at "highest" precision for float32 inputs (see the docstring)."""
  if jnp.dtype(dtype) == jnp.float32:
    return jax.default_matmul_precision("highest")
  return contextlib.nullcontext()


def _row_tile(rows: int) -> int:
  """tm: `_ROW_TILE` rows, or fewer for small problems (a multiple of `_SUBLANES`)."""
  return min(_ROW_TILE, _round_up(rows, _SUBLANES))


def _lane_tile(size: int) -> int:
  """tk or tn: the largest of `_LANE_TILES` dividing `size` rounded up to 128 lanes."""
  return next(tile for tile in _LANE_TILES if _round_up(size, _LANES) % tile == 0)


def _round_up(size: int, multiple: int) -> int:
  return slot_layout.cdiv(size, multiple) * multiple


def _pad_rows(a_rx: jax.Array, rows: int) -> jax.Array:
  """`a_rx` with zero rows appended up to `rows` (itself when it has them already)."""
  if a_rx.shape[0] == rows:
    return a_rx
  return jnp.pad(a_rx, [(0, rows - a_rx.shape[0]), (0, 0)])
