"""CVMM in plain XLA: expert groups padded to whole blocks, one batched matmul.

The slots are sorted by expert and each expert's group is padded to a multiple of `block`
rows (the MegaBlocks idea), so every block of rows belongs to one expert. Gathering that
expert's weight matrix once per block turns the grouped matmul into a single batched
matmul `[B, block, M] x [B, M, L]`, which XLA runs well on CPU (and TPU). The number of
blocks is static: `(S + min(E, S) * (block - 1)) // block` covers any routing, and the
blocks past the last used one hold only padding rows (zeros).

The weight gradient is a batched `x_b^T @ dy_b` per block followed by a sorted segment sum
over the blocks of each expert; experts without blocks get zeros.
"""

import jax
import jax.numpy as jnp
from jax import lax

from pallas_kernels import slot_layout

# Rows per block. Each expert group is padded to a multiple of it and one weight matrix is
# gathered per block, so larger blocks gather fewer weights but pad more (< `block` rows per
# expert). On a 2-core CPU, forward + backward of the benchmark layer (4096 tokens, N_E 32
# and 128, d_model 512, G 128) was fastest at 128 of {32, 64, 128, 256}.
BLOCK_ROWS = 128


def full_precision(dtype) -> lax.Precision | None:
  """f32 products in IEEE f32: GPUs would otherwise round them to TF32 (10-bit mantissa)."""
  return lax.Precision.HIGHEST if jnp.dtype(dtype) == jnp.float32 else None


def num_blocks(num_slots: int, num_experts: int, block: int) -> int:
  """Static bound on the blocks any routing needs: each non-empty expert wastes < 1 block."""
  return (num_slots + min(num_experts, num_slots) * (block - 1)) // block


def make_layout(sel_s: jax.Array, num_experts: int) -> slot_layout.SlotLayout:
  """The padded layout with `BLOCK_ROWS`-row blocks (fewer when there are fewer slots)."""
  return padded_layout(sel_s, num_experts, min(BLOCK_ROWS, sel_s.shape[0]))


def padded_layout(sel_s: jax.Array, num_experts: int, block: int) -> slot_layout.SlotLayout:
  """Sorted slots with every expert group padded to whole blocks of `block` rows.

  `groups` of the result is the expert of each block ([num_blocks] int32).
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
  return slot_layout.SlotLayout(row_slot_r=row_slot_r, slot_row_s=slot_row_s, groups=expert_b)


def matmul(layout: slot_layout.SlotLayout, x_rm: jax.Array, w_eml: jax.Array, *,
           transpose: bool, out_dtype) -> jax.Array:
  """y[r] = x[r] @ w[e(r)] (or @ w[e(r)]^T when `transpose`) as one batched matmul."""
  expert_b = layout.groups
  x_bcm = x_rm.reshape(expert_b.shape[0], -1, x_rm.shape[-1])
  w_bml = jnp.take(w_eml, expert_b, axis=0)
  spec = "bcl,bml->bcm" if transpose else "bcm,bml->bcl"
  y_bcx = jnp.einsum(spec, x_bcm, w_bml, precision=full_precision(x_rm.dtype),
                     preferred_element_type=jnp.float32)
  return y_bcx.reshape(x_rm.shape[0], -1).astype(out_dtype)


def weight_grad(layout: slot_layout.SlotLayout, x_rm: jax.Array, dy_rl: jax.Array, *,
                num_experts: int, out_dtype) -> jax.Array:
  """dw[e] = sum over e's blocks of x_b^T @ dy_b (padding rows are zero)."""
  expert_b = layout.groups
  x_bcm = x_rm.reshape(expert_b.shape[0], -1, x_rm.shape[-1])
  dy_bcl = dy_rl.reshape(expert_b.shape[0], -1, dy_rl.shape[-1])
  dw_bml = jnp.einsum("bcm,bcl->bml", x_bcm, dy_bcl, precision=full_precision(x_rm.dtype),
                      preferred_element_type=jnp.float32)
  dw_eml = jax.ops.segment_sum(dw_bml, expert_b, num_segments=num_experts,
                               indices_are_sorted=True)
  return dw_eml.astype(out_dtype)
