"""benchmarks/decode_changes.py at a toy width: each change keeps the output bit for bit, and
the in-place cache write removes the compiled program's cache copies (timings not checked)."""

import json

import pytest

from benchmarks import decode_changes


def test_each_change_keeps_the_output_and_the_cache_copies_go(tmp_path):
  out = tmp_path / "changes.json"
  result = decode_changes.main(["--d_model=24", "--n_heads=6", "--attention_sparsity=4",
                                "--d_ff=64", "--block_size=8", "--context=4", "--calls=2",
                                f"--out={out}"])
  rows = {r["change"]: r for r in result["rows"]}
  assert list(rows) == list(decode_changes.CHANGES)
  assert all(r["same_output"] and r["with_ms"] > 0 for r in rows.values())
  assert rows["cache_in_place"]["cache_copies"]["without"] > 0
  assert all(r["cache_copies"]["with"] == 0 for r in rows.values())
  assert json.loads(out.read_text())["rows"] == result["rows"]


def test_unknown_changes_are_refused(tmp_path):
  with pytest.raises(SystemExit, match="--changes must be"):
    decode_changes.main(["--changes=cache_in_place,fused_everything", f"--out={tmp_path}/x"])
