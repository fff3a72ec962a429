"""The XLA side of CVMM: sort the N*k token slots by expert, and describe the result.

Slot `s = n * k + j` is token n's j-th choice, routed to expert `sel[n, j]`. Every
implementation except the gather oracle multiplies *rows* of a layout in which the slots of
one expert are contiguous; this module builds that layout once per `cvmm` call (the backward
pass reuses it as a residual) plus, for the Pallas kernels, the table of (tile, expert)
segments that lets each program touch the rows of exactly one expert.

Rows are described by their source, not necessarily copied: row r of a layout holds slot
`row_slot_r[r]`, i.e. token row `row_slot_r[r] // k` of a token-shared input. Backends whose
kernels can load rows through an index (`backends.Backend.gathers_rows`) take an
`IndexedRows` (the source array and that index) and gather inside their row loads; the
others get the [R, D] copy (`rows_from_tokens`, `rows_from_slots`, `materialize`).
"""

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax import lax


class ExpertGroups(NamedTuple):
  """Where each expert's rows are in a layout: rows [starts[e], starts[e] + sizes[e])."""
  starts_e: jax.Array  # [E] int32
  sizes_e: jax.Array  # [E] int32


class SlotLayout(NamedTuple):
  """A row space of R >= S rows holding the S slots grouped by expert.

  row_slot_r: [R] int32, the slot held by each row; S marks a padding row (holds nothing).
  slot_row_s: [S] int32, the row holding each slot (the inverse map).
  groups: implementation-specific description of the expert groups (an `ExpertGroups` for
    the sorted layout, the expert of every block for the blocked one).
  """
  row_slot_r: jax.Array
  slot_row_s: jax.Array
  groups: Any


class IndexedRows(NamedTuple):
  """Rows of a layout left in their source: row r is `source[index_r[r]]`, zeros where
  `index_r[r]` is out of range (>= len(source): a padding row), times `scale_r[r]` when given
  (in float32, rounded back to the source's dtype). A kernel that loads rows through the
  index reads exactly what `materialize` would copy."""
  source: jax.Array  # [N, D]
  index_r: jax.Array  # [R] int32
  scale_r: jax.Array | None = None  # [R] float32


def token_rows_index(layout: SlotLayout, k: int) -> jax.Array:
  """The token row each layout row reads from a token-shared [N, D] input (N for padding)."""
  return layout.row_slot_r // k


def materialize(rows: "jax.Array | IndexedRows") -> jax.Array:
  """The [R, D] rows as an array (an array is returned as is)."""
  if not isinstance(rows, IndexedRows):
    return rows
  values = jnp.take(rows.source, rows.index_r, axis=0, mode="fill", fill_value=0)
  if rows.scale_r is None:
    return values
  return (values.astype(jnp.float32) * rows.scale_r[:, None]).astype(values.dtype)


class SegmentTable(NamedTuple):
  """Pallas work list: program p multiplies sorted rows [starts[p], ends[p]) by w[experts[p]].

  Segments never cross a tile of `block_rows` rows nor an expert boundary, so a program loads
  one row tile and one expert's weights. There are `cdiv(S, block_rows) + E` segments (a
  static bound); the ones with start == end are empty and do nothing.
  """
  starts_p: jax.Array  # [P] int32
  ends_p: jax.Array  # [P] int32
  experts_p: jax.Array  # [P] int32


def sort_slots(sel_s: jax.Array, num_experts: int) -> tuple[jax.Array, jax.Array, ExpertGroups]:
  """Stable sort of the flat slot ids by expert.

  Returns (order_r, rank_s, groups): order_r[i] is the slot at sorted position i, rank_s its
  inverse, groups the [start, start + size) range of each expert in sorted order (size 0 for
  experts nobody chose).
  """
  num_slots = sel_s.shape[0]
  iota_s = lax.iota(jnp.int32, num_slots)
  _, order_r = lax.sort((sel_s, iota_s), num_keys=1, is_stable=True)
  rank_s = jnp.zeros_like(iota_s).at[order_r].set(iota_s, unique_indices=True)
  # Group sizes by counting, not by searching the sorted ids: jnp.searchsorted's default
  # method is a loop of dependent steps, 0.94 ms of a 1.0 ms layout on an H200 (S = 131072),
  # where the count and its cumulative sum take 0.11 ms.
  sizes_e = jnp.zeros((num_experts,), jnp.int32).at[sel_s].add(1, mode="drop")
  starts_e = jnp.cumsum(sizes_e, dtype=jnp.int32) - sizes_e
  return order_r, rank_s, ExpertGroups(starts_e, sizes_e)


def sorted_layout(sel_s: jax.Array, num_experts: int) -> SlotLayout:
  """The unpadded layout (R = S): rows are the slots in expert order."""
  order_r, rank_s, groups = sort_slots(sel_s, num_experts)
  return SlotLayout(row_slot_r=order_r, slot_row_s=rank_s, groups=groups)


def expert_of_rows(starts_e: jax.Array, rows: jax.Array) -> jax.Array:
  """Expert whose group contains each row, given nondecreasing group starts.

  The last expert whose group starts at or before the row; empty groups share their start
  with the next group, so they are never picked for a row inside a non-empty group.
  """
  # Comparing every row with every start (rows x E, both small) is one fused op on any
  # backend, where searchsorted's default method is a loop.
  expert = jnp.sum(starts_e[None, :] <= rows[:, None], axis=1) - 1
  return jnp.clip(expert, 0, starts_e.shape[0] - 1).astype(jnp.int32)


def segment_table(groups: ExpertGroups, num_rows: int, block_rows: int) -> SegmentTable:
  """Cut the sorted rows at every tile start and every expert start (see SegmentTable)."""
  num_tiles = cdiv(num_rows, block_rows)
  tile_starts = jnp.arange(num_tiles, dtype=jnp.int32) * block_rows
  starts_p = jnp.sort(jnp.concatenate([tile_starts, groups.starts_e]))
  ends_p = jnp.concatenate([starts_p[1:], jnp.full((1,), num_rows, jnp.int32)])
  return SegmentTable(starts_p, ends_p, expert_of_rows(groups.starts_e, starts_p))


def rows_from_tokens(values_n: jax.Array, layout: SlotLayout, k: int) -> jax.Array:
  """Row r of the layout takes token row (slot // k); padding rows get zeros."""
  return materialize(IndexedRows(values_n, token_rows_index(layout, k)))


def rows_from_slots(values_s: jax.Array, layout: SlotLayout) -> jax.Array:
  """Row r of the layout takes slot row_slot[r]; padding rows get zeros."""
  return materialize(IndexedRows(values_s, layout.row_slot_r))


def cdiv(a: int, b: int) -> int:
  """Ceiling division of Python ints (static shapes)."""
  return -(-a // b)
