"""benchmarks/tune_blocks.py sweeps and reports at toy sizes on CPU (not a benchmark)."""

import json

import jax
import jax.numpy as jnp
import pytest

from benchmarks import tune_blocks


@pytest.mark.skipif(jax.default_backend() == "gpu", reason="the CPU smoke run")
def test_sweep_reports_the_best_tiles_and_records_failures(tmp_path):
  summaries = tune_blocks.main(["--smoke", "--out", str(tmp_path)])
  saved = json.loads((tmp_path / "tune_blocks.json").read_text())
  assert saved["summary"] == summaries
  assert {(s["kernel"], s["projection"]) for s in summaries} == {
      (k, p) for k in ("triton_forward", "triton_weight_grad", "mosaic_forward",
                       "mosaic_input_grad", "mosaic_weight_grad") for p in ("up", "down")} | {
      (f"xl_attention_{k}", "wt103_s") for k in ("forward", "dkdv", "dq")}
  for s in summaries:
    rows = saved["details"][f"{s['kernel']}/{s['projection']}"]
    if not s["kernel"].startswith("mosaic"):  # Interpret mode runs every candidate.
      times = [r["ms"] for r in rows]
      assert s["failed"] == 0 and s["default_ms"] == times[0] and s["best_ms"] == min(times)
    else:  # Mosaic GPU has no interpret mode: every candidate is a recorded error.
      assert s["failed"] == s["tried"] == len(rows) and s["best_ms"] is None
      assert all("error" in r for r in rows)


@pytest.mark.skipif(jax.default_backend() == "gpu", reason="the CPU smoke run")
def test_the_xl_sweep_alone_names_its_tiles(tmp_path):
  summaries = tune_blocks.main(["--smoke", "--kernels", "xl_attention", "--out", str(tmp_path)])
  assert [s["kernel"] for s in summaries] == [
      "xl_attention_forward", "xl_attention_dkdv", "xl_attention_dq"]
  rows = json.loads((tmp_path / "tune_blocks.json").read_text())["details"][
      "xl_attention_dq/wt103_s"]
  assert rows[1]["blocks"] == {"q": 64, "k": 32, "num_warps": 4, "num_stages": 2}
  with pytest.raises(SystemExit):
    tune_blocks.main(["--smoke", "--kernels", "cvmm,flash", "--out", str(tmp_path)])
  with pytest.raises(SystemExit):  # The deviceless report covers the XL kernels only.
    tune_blocks.main(["--deviceless", "h100", "--out", str(tmp_path)])


def test_each_xl_candidate_sets_its_own_kernels_tiles_only():
  """A dk/dv candidate leaves the dq and forward kernels at the rule's tiles, and so on; its
  head is 64 wide in registers at the WT-103 S layer (48 channels in memory)."""
  batch, seq_len, mem_len, heads, head = tune_blocks._XL_SHAPE
  queries = jax.ShapeDtypeStruct((batch, seq_len, heads, head), jnp.bfloat16)
  keys = jax.ShapeDtypeStruct((batch, seq_len + mem_len, heads, head), jnp.bfloat16)
  inputs = (queries, queries, keys)
  for kernel, candidates in tune_blocks._XL_CANDIDATES.items():
    q, k, warps, stages = candidates[0]
    tiles = tune_blocks._xl_tiles(kernel, candidates[0], inputs)
    assert getattr(tiles, kernel) == tune_blocks.XLBlocks(q, k, 64, num_warps=warps,
                                                          num_stages=stages)
    assert all(getattr(tiles, other) is None for other in tune_blocks._XL_CANDIDATES
               if other != kernel)
  assert tune_blocks._xl_tiles("dq", None, inputs) == tune_blocks.XLTiles()


@pytest.mark.skipif(jax.default_backend() == "gpu", reason="the CPU smoke run")
def test_a_spent_budget_skips_the_remaining_tiles(tmp_path):
  summaries = tune_blocks.main(["--smoke", "--budget_s", "0", "--out", str(tmp_path)])
  details = json.loads((tmp_path / "tune_blocks.json").read_text())["details"]
  assert all(s["best_ms"] is None for s in summaries)
  assert all(row == {"blocks": row["blocks"], "error": "skipped: time budget"}
             for rows in details.values() for row in rows)
