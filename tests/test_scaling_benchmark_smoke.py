"""benchmarks/scaling.py runs end to end on the simulated devices at toy sizes (its timings
are not checked here)."""

import json

from benchmarks import scaling


def test_scaling_benchmark_writes_its_table(tmp_path, capsys):
  out = tmp_path / "scaling.json"
  result = scaling.main(["--devices=2", "--d_model=16", "--batch=8", "--seq_len=8",
                         "--steps=1", f"--out={out}"])
  assert json.loads(out.read_text()) == result
  assert [(r["parallelism"], r["devices"]) for r in result["rows"]] == [
      (axis, 2) for axis in ("data", "fsdp", "expert")]
  assert all(r["step_ms"] > 0 for r in result["rows"])
  assert "expert" in capsys.readouterr().out
