"""CVMM in plain XLA: expert groups padded to whole blocks, a loop of dense block matmuls.

The slots are sorted by expert and each expert's group is padded to a multiple of `block`
rows (the MegaBlocks idea), so every block of rows belongs to one expert. A `fori_loop` over
the blocks in use multiplies each `[block, M]` row block by its expert's `[M, L]` weights
(read in place: no gathered copy of the weights) and writes the result in place. The number
of blocks is static, `(S + min(E, S) * (block - 1)) // block` covers any routing, but the loop
stops at the last block in use; the rows of the blocks past it are zeros (never read back).

The weight gradient loops over the same blocks, adding `x_b^T @ dy_b` into its expert's
`[M, L]` slice; experts without blocks keep zeros.

On a 2-core CPU the layer built on this loop ran faster against dense than the previous
blocked impl, one batched matmul over gathered weights `[B, block, M] x [B, M, L]`, which
XLA:CPU ran well below the dense rate (`benchmarks/RESULTS.md`).
"""

from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from pallas_kernels import slot_layout

# Rows per block. Each expert group is padded to a multiple of it, so larger blocks pad more
# (< `block` rows per expert) but run fewer, larger matmuls. On a 2-core CPU (the sigma-MoE
# layer of benchmarks/cvmm.py, 4096 tokens, K 4) 256-row blocks ran the layer 15-50% faster
# than 128-row ones at N_E 8 to 64, where experts average 256 rows or more, and 512 slower;
# at N_E 128 (128 rows per expert) 128 and 256 were alike within the machine's noise.
BLOCK_ROWS = (128, 256)


class BlockGroups(NamedTuple):
  """The expert of each block of the padded layout, and how many blocks are in use."""
  expert_b: jax.Array  # [B] int32
  used: jax.Array  # [] int32


def full_precision(dtype) -> lax.Precision | None:
  """f32 products in IEEE f32: GPUs would otherwise round them to TF32 (10-bit mantissa)."""
  return lax.Precision.HIGHEST if jnp.dtype(dtype) == jnp.float32 else None


def num_blocks(num_slots: int, num_experts: int, block: int) -> int:
  """Static bound on the blocks any routing needs: each non-empty expert wastes < 1 block."""
  return (num_slots + min(num_experts, num_slots) * (block - 1)) // block


def block_rows(num_slots: int, num_experts: int) -> int:
  """The larger block when experts average at least that many rows, else the smaller one;
  never more rows than there are slots."""
  small, large = BLOCK_ROWS
  block = large if num_slots >= large * num_experts else small
  return min(block, num_slots)


def make_layout(sel_s: jax.Array, num_experts: int) -> slot_layout.SlotLayout:
  """The padded layout with `block_rows` rows per block."""
  return padded_layout(sel_s, num_experts, block_rows(sel_s.shape[0], num_experts))


def padded_layout(sel_s: jax.Array, num_experts: int, block: int) -> slot_layout.SlotLayout:
  """Sorted slots with every expert group padded to whole blocks of `block` rows.

  `groups` of the result is a `BlockGroups`.
  """
  num_slots = sel_s.shape[0]
  order_r, rank_s, groups = slot_layout.sort_slots(sel_s, num_experts)
  blocks_e = slot_layout.cdiv(groups.sizes_e, block)
  first_block_e = jnp.cumsum(blocks_e) - blocks_e
  expert_b = slot_layout.expert_of_rows(
      first_block_e, jnp.arange(num_blocks(num_slots, num_experts, block), dtype=jnp.int32))

  expert_r = jnp.repeat(expert_b, block)
  offset_r = jnp.arange(expert_r.shape[0], dtype=jnp.int32) - first_block_e[expert_r] * block
  sorted_pos_r = jnp.minimum(groups.starts_e[expert_r] + offset_r, num_slots - 1)
  row_slot_r = jnp.where(offset_r < groups.sizes_e[expert_r], order_r[sorted_pos_r], num_slots)
  slot_row_s = first_block_e[sel_s] * block + rank_s - groups.starts_e[sel_s]
  return slot_layout.SlotLayout(row_slot_r=row_slot_r, slot_row_s=slot_row_s,
                                groups=BlockGroups(expert_b, jnp.sum(blocks_e, dtype=jnp.int32)))


def _varying_axes(a: jax.Array) -> frozenset:
  """The mesh axes `a` varies over inside `shard_map` (`vma` in most JAX releases,
  `manual_axis_type.varying` in 0.10); empty outside."""
  aval = jax.typeof(a)
  if hasattr(aval, "vma"):
    return frozenset(aval.vma)
  return frozenset(getattr(getattr(aval, "manual_axis_type", None), "varying", ()))


def zeros_varying_like(shape, dtype, *operands: jax.Array) -> jax.Array:
  """Zeros to start a loop's output with, varying over the mesh axes its operands vary
  over inside `shard_map` (a loop's carry must keep one type; elsewhere plain zeros)."""
  axes = frozenset().union(*map(_varying_axes, operands))
  zeros = jnp.zeros(shape, dtype)
  return lax.pcast(zeros, tuple(sorted(axes)), to="varying") if axes else zeros


def _row_block(a_rx: jax.Array, b, block: int) -> jax.Array:
  """Rows [b * block, (b + 1) * block) of `a_rx`."""
  return lax.dynamic_slice_in_dim(a_rx, b * block, block)


def matmul(layout: slot_layout.SlotLayout, x_rm: jax.Array, w_eml: jax.Array, *,
           transpose: bool, out_dtype) -> jax.Array:
  """y[r] = x[r] @ w[e(r)] (or @ w[e(r)]^T when `transpose`), one block of rows at a time."""
  expert_b, used = layout.groups
  block = x_rm.shape[0] // expert_b.shape[0]
  size_out = w_eml.shape[1] if transpose else w_eml.shape[2]
  contract = 1 if transpose else 0  # The dimension of w[e] that meets x's columns.

  def one_block(b, y_rx):
    w_ml = lax.dynamic_index_in_dim(w_eml, expert_b[b], keepdims=False)
    y_cx = lax.dot_general(_row_block(x_rm, b, block), w_ml, (((1,), (contract,)), ((), ())),
                           precision=full_precision(x_rm.dtype),
                           preferred_element_type=jnp.float32)
    return lax.dynamic_update_slice_in_dim(y_rx, y_cx.astype(out_dtype), b * block, 0)

  y_rx = zeros_varying_like((x_rm.shape[0], size_out), out_dtype, x_rm, w_eml)
  return lax.fori_loop(0, used, one_block, y_rx)


def weight_grad(layout: slot_layout.SlotLayout, x_rm: jax.Array, dy_rl: jax.Array, *,
                num_experts: int, out_dtype) -> jax.Array:
  """dw[e] = sum over e's blocks of x_b^T @ dy_b (padding rows are zero), in f32."""
  expert_b, used = layout.groups
  block = x_rm.shape[0] // expert_b.shape[0]

  def one_block(b, dw_eml):
    dw_ml = lax.dot_general(_row_block(x_rm, b, block), _row_block(dy_rl, b, block),
                            (((0,), (0,)), ((), ())), precision=full_precision(x_rm.dtype),
                            preferred_element_type=jnp.float32)
    e = expert_b[b]
    dw_ml = dw_ml + lax.dynamic_index_in_dim(dw_eml, e, keepdims=False)
    return lax.dynamic_update_index_in_dim(dw_eml, dw_ml, e, 0)

  dw_eml = zeros_varying_like((num_experts, x_rm.shape[1], dy_rl.shape[1]), jnp.float32,
                              x_rm, dy_rl)
  return lax.fori_loop(0, used, one_block, dw_eml).astype(out_dtype)
