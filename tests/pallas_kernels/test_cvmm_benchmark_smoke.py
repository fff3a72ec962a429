"""benchmarks/cvmm.py runs end to end at toy sizes and writes its JSON (not a benchmark)."""

import importlib.util
import json
import pathlib

_SCRIPT = pathlib.Path(__file__).parents[2] / "benchmarks" / "cvmm.py"


def test_benchmark_script_runs_at_toy_sizes(tmp_path):
  spec = importlib.util.spec_from_file_location("cvmm_benchmark", _SCRIPT)
  script = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(script)
  output = tmp_path / "cvmm.json"
  rows = script.main(["--tokens", "32", "--d_model", "16", "--group", "16", "--k", "2",
                      "--experts", "4", "--impls", "blocked,ragged,gather", "--repeats", "1",
                      "--output", str(output)])
  assert [r["impl"] for r in rows] == ["dense", "blocked", "ragged", "gather"]
  saved = json.loads(output.read_text())
  assert saved["rows"] == rows and saved["meta"]["tokens"] == 32
  assert all(r["fwd_ms"] > 0 and r["fwd_bwd_ms"] > 0 for r in rows)
