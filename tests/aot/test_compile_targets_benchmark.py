"""`benchmarks/compile_targets.py`: its batch search (on stand-in compiles) and a quick run.

The module is imported inside each test: importing it sets JAX's configuration (the CPU
backend, no persistent cache, optimised compiles), which this directory's fixture restores
after each test.
"""

import importlib
import json

import pytest

from aot_testing import needs_gpu
from cli_testing import run_script


@pytest.fixture
def compile_targets(monkeypatch):
  """The module, its compiles replaced: a step fits while the batch is at most `limit`."""
  module = importlib.import_module("benchmarks.compile_targets")
  module.limit = 24

  def config_row(target, name, roberta_dir, batch_size=None):
    return {"batch_size": batch_size, "compiled": True, "fits": batch_size <= module.limit}

  monkeypatch.setattr(module, "config_row", config_row)
  return module


@pytest.mark.parametrize("first,limit,expected", [
    (64, 24, 16),  # Halving from a batch that does not fit.
    (8, 24, 16),  # Doubling from one that fits.
    (8, 10**6, 128),  # Doubling stops at MAX_BATCH_FACTOR times the config's batch.
    (4, 0, None),  # Not even a batch of 1.
])
def test_the_largest_batch_is_searched_from_the_configs(compile_targets, first, limit, expected):
  compile_targets.limit = limit
  row = {"batch_size": first, "fits": first <= limit}
  assert compile_targets.largest_batch(None, "config", "", row) == expected


def test_the_table_marks_a_capped_search_and_libtpus_refusal(compile_targets):
  rows = [{"target": "v5e", "config": "a", "batch_size": 8, "compiled": True, "train_gib": 1.0,
           "eval_peak_gib": 0.5, "device_gib": 16.0, "fits": True, "xla_options": {},
           "largest_batch": 128},
          {"target": "v5e", "config": "b", "batch_size": 64, "compiled": False, "fits": False,
           "error": "RESOURCE_EXHAUSTED: Ran out of memory on HBM", "largest_batch": 8}]
  table = compile_targets.markdown(rows)
  assert "| v5e | a | 8 | yes | 1.00 | 0.50 | 16.0 | yes | >= 128 |" in table
  assert "| v5e | b | 64 | no: RESOURCE_EXHAUSTED: Ran out of memory on HBM | | | | no | 8 |" \
      in table


def test_a_misspelt_config_fails_before_any_compile(tmp_path):
  result = run_script("-m", "benchmarks.compile_targets", "--out", str(tmp_path),
                      "--parts=configs", "--configs", "moe_variants.py:wt103_s,pkm")
  assert result.returncode != 0 and "variant must be one of" in result.stderr
  assert not (tmp_path / "compile_targets.json").exists()


@needs_gpu
def test_a_quick_kernel_run_reports_our_triton_kernels(tmp_path):
  result = run_script("-m", "benchmarks.compile_targets", "--out", str(tmp_path),
                      "--parts=kernels", "--targets=a100", "--impls=pallas", "--quick")
  assert result.returncode == 0, result.stderr[-3000:]
  rows = json.loads((tmp_path / "compile_targets.json").read_text())["rows"]
  assert rows and all(r["compiled"] for r in rows)
  for row in rows:
    names = {k["name"].split("__")[0] for k in row["kernels"]}
    assert names == {"cvmm_segment_matmul", "cvmm_weight_grad"}, row
    assert not any(k["spill_stores"] or k["spill_loads"] for k in row["kernels"])
  assert "| a100 | expert_mlp | pallas | 412 | 16 | bfloat16 | yes |" in (
      tmp_path / "compile_targets.md").read_text()
