"""benchmarks/routing_health_cost.py runs end to end at toy sizes (timings are not checked)."""

import json

from benchmarks import routing_health_cost


def test_routing_health_cost_writes_its_table(tmp_path, capsys):
  out = tmp_path / "routing_health_cost.json"
  result = routing_health_cost.main(["--preset=tiny", "--rounds=2", "--host_repeats=1",
                                     f"--out={out}"])
  assert json.loads(out.read_text())["step_seconds"] == result["step_seconds"]
  assert result["routing_metrics"] == ["routing/layer0/token_share",
                                       "routing/layer1/token_share"]
  assert all(len(t) == 2 and min(t) > 0 for t in result["step_seconds"].values())
  assert set(result["step_ms"]) == {"on", "off"}
  assert "overhead of `on`" in capsys.readouterr().out
