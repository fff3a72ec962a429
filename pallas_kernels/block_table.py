"""Block sizes for the CVMM implementations, looked up from (M, L, dtype).

Kernels never hard-code tile sizes: `cvmm` asks this table once per call and passes the
result down as static arguments. A problem is keyed by its inner size M (the contracted
dimension), its output size L and the input dtype; the table lists tuned entries and falls
back to a rule for shapes it has not seen. Every Pallas block is a power of 2 and at least 16
(Triton's `tl.dot` needs both), clamped to the problem so tiny test shapes stay cheap.
"""

import dataclasses

import jax.numpy as jnp

_MIN_DOT_BLOCK = 16


@dataclasses.dataclass(frozen=True)
class MatmulBlocks:
  """Tiles of the Pallas forward / input-gradient kernel.

  rows: sorted slot rows per program (the tile a (tile, expert) segment lives in).
  cols: output columns (L) per program.
  inner: contracted columns (M) per loop step.
  """
  rows: int
  cols: int
  inner: int
  num_warps: int
  num_stages: int


@dataclasses.dataclass(frozen=True)
class WeightGradBlocks:
  """Tiles of the Pallas weight-gradient kernel: dW[e] tile [rows_m, cols] per program,
  accumulated over that expert's slots `inner` rows at a time."""
  rows_m: int
  cols: int
  inner: int
  num_warps: int
  num_stages: int


# (M, L, dtype name) -> forward tiles for the sigma-MoE shapes (d_model 512, G 128): up
# projection M = d_model, L = G; down projection M = G, L = d_model. Starting points in the
# range of the Pallas GPU examples, not yet tuned on a GPU (none was available).
_MATMUL_TABLE = {
    (512, 128, "bfloat16"): MatmulBlocks(rows=64, cols=128, inner=64, num_warps=4, num_stages=3),
    (128, 512, "bfloat16"): MatmulBlocks(rows=64, cols=128, inner=64, num_warps=4, num_stages=3),
    (512, 128, "float32"): MatmulBlocks(rows=64, cols=64, inner=32, num_warps=4, num_stages=3),
    (128, 512, "float32"): MatmulBlocks(rows=64, cols=64, inner=32, num_warps=4, num_stages=3),
}

# Blocked XLA path: rows per block. Each expert group is padded to a multiple of this, and one
# weight matrix [M, L] is gathered per block, so larger blocks mean fewer gathered weights
# but more padding (at most `rows - 1` wasted rows per expert). On a 2-core CPU, forward +
# backward of the benchmark layer (4096 tokens, N_E 32 and 128) was fastest at 128 of
# {32, 64, 128, 256}: smaller blocks make the batched matmul inefficient.
_BLOCKED_TABLE = {
    (512, 128, "float32"): 128,
    (128, 512, "float32"): 128,
    (512, 128, "bfloat16"): 128,
    (128, 512, "bfloat16"): 128,
}


def _pow2_at_least(n: int, floor: int = _MIN_DOT_BLOCK) -> int:
  """Smallest power of 2 that is >= max(n, floor)."""
  p = floor
  while p < n:
    p *= 2
  return p


def _clamp(block: int, extent: int) -> int:
  """A power-of-2 block no larger than needed to cover `extent` (and at least 16)."""
  return min(block, _pow2_at_least(extent))


def _dtype_key(dtype) -> str:
  return jnp.dtype(dtype).name


def matmul_blocks(num_rows: int, m: int, l: int, dtype) -> MatmulBlocks:
  """Tiles for y[S, L] = x[S, M] @ w[e][M, L] over `num_rows` sorted slots."""
  wide = jnp.dtype(dtype).itemsize >= 4
  default = MatmulBlocks(rows=64, cols=64 if wide else 128, inner=32 if wide else 64,
                         num_warps=4, num_stages=3)
  blocks = _MATMUL_TABLE.get((m, l, _dtype_key(dtype)), default)
  return dataclasses.replace(
      blocks, rows=_clamp(blocks.rows, num_rows), cols=_clamp(blocks.cols, l),
      inner=_clamp(blocks.inner, m))


def weight_grad_blocks(num_rows: int, m: int, l: int, dtype) -> WeightGradBlocks:
  """Tiles for dW[e][M, L] = x_e^T @ dy_e over at most `num_rows` rows per expert."""
  wide = jnp.dtype(dtype).itemsize >= 4
  rows_m = 64
  cols = 64 if wide else 128
  inner = 32 if wide else 64
  return WeightGradBlocks(rows_m=_clamp(rows_m, m), cols=_clamp(cols, l),
                          inner=_clamp(inner, num_rows), num_warps=4, num_stages=3)


def blocked_rows(num_rows: int, m: int, l: int, dtype) -> int:
  """Rows per block of the blocked XLA implementation (any positive size works)."""
  rows = _BLOCKED_TABLE.get((m, l, _dtype_key(dtype)), 128)
  return max(1, min(rows, num_rows))
