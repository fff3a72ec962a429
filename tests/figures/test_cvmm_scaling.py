"""Fig. 2/6/7 from real `benchmarks/cvmm.py` output at toy sizes: the figure's series are the
JSON rows grouped by impl and sorted here by hand; files it must refuse."""

import importlib.util
import json
import pathlib

import jax
import pytest

from sparse_jax.figures import cvmm_scaling

_REPO = pathlib.Path(__file__).parents[2]
_SCRIPT = _REPO / "benchmarks" / "cvmm.py"
_COMMITTED = str(_REPO / "benchmarks" / "cvmm_cpu_float32_quiet.json")  # before sweeps/memory
_SERIES = ("fwd_ms", "fwd_bwd_ms", "fwd_memory_mb", "fwd_bwd_memory_mb")


@pytest.fixture(scope="module")
def group_sweep(tmp_path_factory):
  """A real sweep over G, values given in descending order (the figure sorts them); the gather
  impl compiles fastest, and which impl it is does not matter here."""
  spec = importlib.util.spec_from_file_location("cvmm_benchmark", _SCRIPT)
  script = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(script)
  path = tmp_path_factory.mktemp("cvmm") / "group.json"
  script.main(["--tokens", "32", "--k", "2", "--impls", "gather", "--repeats", "1",
               "--d_model", "16", "--experts", "4", "--sweep", "group", "--values", "16,8",
               "--output", str(path)])
  return str(path)


def _by_hand(rows: list[dict], impl: str) -> dict:
  mine = sorted((r for r in rows if r["impl"] == impl), key=lambda r: r["group"])
  return {"x": [r["group"] for r in mine], **{key: [r[key] for r in mine] for key in _SERIES}}


def _write(path, meta, rows) -> str:
  path.write_text(json.dumps({"meta": meta, "rows": rows}))
  return str(path)


def test_figure_series_are_the_rows_by_impl(group_sweep, tmp_path):
  paths = cvmm_scaling.make_cvmm_scaling([group_sweep], str(tmp_path))
  with open(paths["png"], "rb") as f:
    assert f.read(8) == b"\x89PNG\r\n\x1a\n"
  assert pathlib.Path(paths["png"]).stat().st_size > 1000
  numbers = json.loads(open(paths["json"]).read())
  rows = json.loads(open(group_sweep).read())["rows"]
  assert numbers["sweep"] == "group" and numbers["files"] == [group_sweep]
  assert numbers["setting"] == {"experts": 4, "d_model": 16, "tokens": 32, "k": 2,
                                "dtype": "float32", "device": jax.devices()[0].device_kind}
  assert list(numbers["impls"]) == ["dense", "gather"]
  for impl in ("dense", "gather"):
    assert numbers["impls"][impl] == _by_hand(rows, impl)
    assert numbers["impls"][impl]["x"] == [8, 16]
    assert all(m > 0 for m in numbers["impls"][impl]["fwd_bwd_memory_mb"])  # CPU reports it


def test_impls_from_two_files_of_one_setting_make_one_figure(group_sweep, tmp_path):
  saved = json.loads(open(group_sweep).read())
  dense = _write(tmp_path / "dense.json", saved["meta"],
                 [r for r in saved["rows"] if r["impl"] == "dense"])
  moe = _write(tmp_path / "moe.json", saved["meta"],
               [r for r in saved["rows"] if r["impl"] != "dense"])
  numbers = cvmm_scaling.compute_cvmm_scaling([moe, dense])
  assert list(numbers["impls"]) == ["gather", "dense"]
  assert numbers["impls"] == {impl: _by_hand(saved["rows"], impl) for impl in ("gather", "dense")}


def test_files_from_before_the_sweeps_are_experts_sweeps_without_memory(tmp_path):
  paths = cvmm_scaling.make_cvmm_scaling([_COMMITTED], str(tmp_path))
  numbers = json.loads(open(paths["json"]).read())
  rows = [r for r in json.loads(open(_COMMITTED).read())["rows"] if r["impl"] == "blocked"]
  assert numbers["sweep"] == "experts"
  assert numbers["setting"]["group"] == 128 and numbers["setting"]["d_model"] == 512
  assert numbers["impls"]["blocked"]["x"] == [r["experts"] for r in rows]
  assert numbers["impls"]["blocked"]["fwd_ms"] == [r["fwd_ms"] for r in rows]
  assert numbers["impls"]["blocked"]["fwd_bwd_memory_mb"] == [None] * len(rows)


def test_files_it_cannot_plot_are_refused(group_sweep, tmp_path):
  saved = json.loads(open(group_sweep).read())
  text = tmp_path / "notes.json"
  text.write_text("fwd_ms: 3")
  other = _write(tmp_path / "other.json", saved["meta"], [{"x": 1}])
  more_tokens = _write(tmp_path / "tokens.json", dict(saved["meta"], tokens=64), saved["rows"])
  cases = [([str(text)], "notes.json is not JSON"),
           ([other], "other.json is not the JSON of benchmarks/cvmm.py"),
           ([group_sweep, _COMMITTED], r"different variables \['experts', 'group'\]"),
           ([group_sweep, more_tokens], 'different settings: .*"tokens": 32.*"tokens": 64'),
           ([group_sweep, group_sweep], "impl 'dense' at group=16 is measured in both")]
  for paths, message in cases:
    with pytest.raises(ValueError, match=message):
      cvmm_scaling.compute_cvmm_scaling(paths)
