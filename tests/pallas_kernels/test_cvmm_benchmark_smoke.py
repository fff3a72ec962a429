"""benchmarks/cvmm.py runs end to end at toy sizes and writes its JSON (not a benchmark)."""

import importlib.util
import json
import pathlib

import pytest

_SCRIPT = pathlib.Path(__file__).parents[2] / "benchmarks" / "cvmm.py"


@pytest.fixture(scope="module")
def script():
  spec = importlib.util.spec_from_file_location("cvmm_benchmark", _SCRIPT)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def test_benchmark_script_runs_at_toy_sizes(script, tmp_path):
  output = tmp_path / "cvmm.json"
  rows = script.main(["--tokens", "32", "--d_model", "16", "--group", "16", "--k", "2",
                      "--experts", "4", "--impls", "blocked,ragged,gather", "--repeats", "1",
                      "--output", str(output)])
  assert [r["impl"] for r in rows] == ["dense", "blocked", "ragged", "gather"]
  saved = json.loads(output.read_text())
  assert saved["rows"] == rows and saved["meta"]["tokens"] == 32
  assert all(r["fwd_ms"] > 0 and r["fwd_bwd_ms"] > 0 for r in rows)
  assert {r["sweep"] for r in rows} == {"experts"}


def test_sweep_over_d_model_labels_rows_and_records_memory(script, tmp_path):
  rows = script.main(["--tokens", "16", "--group", "8", "--k", "2", "--experts", "4",
                      "--sweep", "d_model", "--values", "8,16", "--impls", "gather",
                      "--repeats", "1", "--output", str(tmp_path / "cvmm.json")])
  assert [(r["sweep"], r["d_model"], r["impl"]) for r in rows] == [
      ("d_model", 8, "dense"), ("d_model", 8, "gather"),
      ("d_model", 16, "dense"), ("d_model", 16, "gather")]
  assert {(r["experts"], r["group"]) for r in rows} == {(4, 8)}
  # The CPU backend reports memory; a layer's memory grows with d_model.
  for key in ("fwd_memory_mb", "fwd_bwd_memory_mb"):
    assert all(r[key] > 0 for r in rows)
    assert rows[2][key] > rows[0][key] and rows[3][key] > rows[1][key]


@pytest.mark.parametrize("argv, message", [
    (["--sweep", "group"], "--sweep group needs --values"),
    (["--sweep", "d_model", "--values", "8", "--experts", "4,8"], "give one --experts value"),
])
def test_sweeps_other_than_experts_need_values_and_one_expert_count(script, argv, message):
  with pytest.raises(SystemExit, match=message):
    script.sweep_points(script.parse_args(argv))
