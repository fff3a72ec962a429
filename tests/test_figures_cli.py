"""`figures.py`: a subcommand writes its PNG and JSON; a bad input exits with one line naming
it (the figures' numbers are tested in tests/figures/)."""

import json
import os

import pytest

from sparse_jax.cli import figures

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_cvmm_figure_of_a_committed_benchmark(tmp_path, capsys):
  path = os.path.join(REPO, "benchmarks", "cvmm_cpu_float32_quiet.json")
  figures.main(["cvmm", path, "--out", str(tmp_path), "--name", "fig2"])
  assert "wrote" in capsys.readouterr().out
  numbers = json.loads((tmp_path / "fig2.json").read_text())
  rows = json.loads(open(path).read())["rows"]
  assert numbers["impls"]["blocked"]["fwd_bwd_ms"] == [
      r["fwd_bwd_ms"] for r in rows if r["impl"] == "blocked"]
  assert (tmp_path / "fig2.png").stat().st_size > 0


@pytest.mark.parametrize("argv, message", [
    (["curves", "nowhere"], "figures.py curves: no metrics.jsonl in 'nowhere'"),
    (["channels", "nowhere"], "figures.py channels: no checkpoint in"),
])
def test_bad_inputs_exit_with_one_line(argv, message, tmp_path):
  with pytest.raises(SystemExit, match=message):
    figures.main([*argv, "--out", str(tmp_path)])
