"""benchmarks/default_step.py runs end to end at toy sizes (timings are not checked)."""

import json

from benchmarks import default_step


def test_default_step_times_both_models(tmp_path, capsys):
  out = tmp_path / "default_step.json"
  result = default_step.main(["--preset=tiny", "--rounds=2", f"--out={out}"])
  assert json.loads(out.read_text())["step_seconds"] == result["step_seconds"]
  assert set(result["step_ms"]) == {"sigma_moe", "dense"}
  assert all(len(t) == 2 and min(t) > 0 for t in result["step_seconds"].values())
  assert "sigma-MoE speed-up over dense" in capsys.readouterr().out
