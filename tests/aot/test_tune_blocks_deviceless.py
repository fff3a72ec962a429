"""`benchmarks/tune_blocks.py --deviceless`: every XL attention candidate compiled for an H100 on
CPU, with its kernel's ptxas report: the candidate lists hold no tiles that spill, and the
report tells Hopper's wgmma tiles from mma.sync ones (the rule's 32-row backward tiles)."""

import json

from benchmarks import tune_blocks
from aot_testing import needs_gpu


@needs_gpu
def test_no_xl_candidate_spills_on_an_h100_and_wgmma_is_told_apart(tmp_path):
  rows = tune_blocks.main(["--kernels", "xl_attention", "--deviceless", "h100",
                           "--out", str(tmp_path)])
  saved = json.loads((tmp_path / "tune_blocks_deviceless_h100.json").read_text())
  assert saved["rows"] == rows
  assert len(rows) == sum(len(c) + 1 for c in tune_blocks._XL_CANDIDATES.values())
  for row in rows:
    assert row["spill_bytes"] == 0 and 0 < row["registers"] <= 255, row
    assert row["wgmma"] + row["mma_sync"] > 0, row
  by_tiles = {(r["kernel"], tuple(r["blocks"].values())): r for r in rows}
  # Queries by keys, warps, stages: 32-row tiles take mma.sync, a warpgroup's 64 rows wgmma.
  assert by_tiles["dq", (32, 32, 4, 2)]["wgmma"] == 0
  assert by_tiles["dq", (64, 32, 4, 2)]["mma_sync"] == 0
  assert by_tiles["dkdv", (64, 64, 8, 2)]["mma_sync"] == 0
  assert by_tiles["forward", (64, 64, 8, 2)]["default"]
