"""Fig. 2/6/7 from real `benchmarks/cvmm.py` output at toy sizes: the figure's series are the
JSON rows grouped by impl here by hand; the script's sweeps over G and d_model."""

import importlib.util
import json
import pathlib

import pytest

from sparse_jax.figures import cvmm_scaling

_SCRIPT = pathlib.Path(__file__).parents[2] / "benchmarks" / "cvmm.py"
_TOY = ["--tokens", "32", "--k", "2", "--impls", "blocked,gather", "--repeats", "1"]


def _benchmark():
  spec = importlib.util.spec_from_file_location("cvmm_benchmark", _SCRIPT)
  script = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(script)
  return script


@pytest.fixture(scope="module")
def group_sweep(tmp_path_factory):
  path = tmp_path_factory.mktemp("cvmm") / "group.json"
  _benchmark().main([*_TOY, "--d_model", "16", "--experts", "4", "--sweep", "group",
                     "--values", "8,16", "--output", str(path)])
  return str(path)


def test_sweep_over_group_sizes_fixes_the_others(group_sweep):
  rows = json.loads(open(group_sweep).read())["rows"]
  assert [(r["group"], r["impl"]) for r in rows] == [
      (8, "dense"), (8, "blocked"), (8, "gather"), (16, "dense"), (16, "blocked"),
      (16, "gather")]
  assert {(r["experts"], r["d_model"], r["sweep"]) for r in rows} == {(4, 16, "group")}
  assert all(r["fwd_bwd_memory_mb"] > 0 for r in rows)  # the CPU backend reports memory


def test_figure_series_are_the_rows_by_impl(group_sweep, tmp_path):
  paths = cvmm_scaling.make_cvmm_scaling([group_sweep], str(tmp_path))
  numbers = json.loads(open(paths["json"]).read())
  with open(paths["png"], "rb") as f:
    assert f.read(8) == b"\x89PNG\r\n\x1a\n"
  rows = json.loads(open(group_sweep).read())["rows"]
  assert numbers["sweep"] == "group"
  for impl in ("dense", "blocked", "gather"):
    mine = [r for r in rows if r["impl"] == impl]
    assert numbers["impls"][impl] == {"x": [r["group"] for r in mine],
                                      "fwd_bwd_ms": [r["fwd_bwd_ms"] for r in mine],
                                      "fwd_bwd_memory_mb": [r["fwd_bwd_memory_mb"] for r in mine]}


def test_files_of_another_kind_or_mixed_sweeps_are_refused(group_sweep, tmp_path):
  other = tmp_path / "other.json"
  other.write_text(json.dumps({"rows": [{"x": 1}]}))
  with pytest.raises(ValueError, match="not the JSON of benchmarks/cvmm.py"):
    cvmm_scaling.compute_cvmm_scaling([str(other)])
  experts = tmp_path / "experts.json"
  _benchmark().main([*_TOY, "--d_model", "16", "--group", "8", "--experts", "2,4",
                     "--output", str(experts)])
  with pytest.raises(ValueError, match=r"different variables \['experts', 'group'\]"):
    cvmm_scaling.compute_cvmm_scaling([group_sweep, str(experts)])
  assert cvmm_scaling.compute_cvmm_scaling([str(experts)])["impls"]["dense"]["x"] == [2, 4]
