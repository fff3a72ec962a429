"""The XLA-side tables: sorted slots, padded blocks and the Pallas segment table.

On a GPU the forward programs write disjoint rows of one output, so a segment table that
overlapped or mixed experts would race; interpret mode runs programs in order and could hide
that, hence these direct checks of the tables.
"""

import jax
import numpy as np
import pytest

from pallas_kernels import blocked, slot_layout


def _routing(n_slots, experts, seed):
  """Random expert ids with roughly half of the experts left empty."""
  rng = np.random.default_rng(seed)
  return rng.choice(rng.permutation(experts)[: max(1, experts // 2)], n_slots).astype(np.int32)


@pytest.mark.parametrize("n_slots, experts, block_rows", [(1, 1, 16), (37, 5, 16), (600, 16, 64)])
def test_segments_cover_rows_once_within_one_tile_and_one_expert(n_slots, experts, block_rows):
  sel = _routing(n_slots, experts, seed=n_slots)
  order, rank, groups = jax.jit(slot_layout.sort_slots, static_argnums=1)(sel, experts)
  table = jax.jit(slot_layout.segment_table, static_argnums=(1, 2))(groups, n_slots, block_rows)
  starts, ends, seg_experts = map(np.asarray, table)
  assert len(starts) == -(-n_slots // block_rows) + experts
  covered = np.zeros(n_slots, int)
  sorted_sel = sel[np.asarray(order)]
  for start, end, expert in zip(starts, ends, seg_experts):
    assert start <= end
    covered[start:end] += 1
    if start < end:
      assert start // block_rows == (end - 1) // block_rows, "a segment crosses a tile"
      assert np.all(sorted_sel[start:end] == expert), "a segment mixes experts"
  np.testing.assert_array_equal(covered, 1)
  np.testing.assert_array_equal(np.asarray(order)[np.asarray(rank)], np.arange(n_slots))


@pytest.mark.parametrize("n_slots, experts, block", [(1, 1, 4), (37, 5, 8), (600, 16, 32)])
def test_blocked_layout_pads_each_expert_to_whole_blocks(n_slots, experts, block):
  sel = _routing(n_slots, experts, seed=block)
  layout = jax.jit(blocked.padded_layout, static_argnums=(1, 2))(sel, experts, block)
  row_slot, slot_row = np.asarray(layout.row_slot_r), np.asarray(layout.slot_row_s)
  expert_b, used = np.asarray(layout.groups.expert_b), int(layout.groups.used)
  assert len(expert_b) == blocked.num_blocks(n_slots, experts, block) == len(row_slot) // block
  assert used == sum(-(-np.sum(sel == e) // block) for e in range(experts))
  assert np.all(row_slot[used * block:] == n_slots), "blocks past the used ones hold padding"
  np.testing.assert_array_equal(row_slot[slot_row], np.arange(n_slots))
  real = row_slot < n_slots
  assert real.sum() == n_slots
  np.testing.assert_array_equal(sel[row_slot[real]], np.repeat(expert_b, block)[real])
