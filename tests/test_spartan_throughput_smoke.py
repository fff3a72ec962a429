"""benchmarks/spartan_throughput.py runs end to end at toy sizes (timings are not checked)."""

import json

from benchmarks import spartan_throughput


def test_spartan_throughput_writes_both_tables(tmp_path, capsys):
  out = tmp_path / "spartan_throughput.json"
  spartan_throughput.main(["--preset=tiny", "--batch=2", "--length=8", "--repeats=1",
                           f"--out={out}"])
  result = json.loads(out.read_text())
  for phase in ("inference", "finetune"):
    rows = result[phase]
    assert [r["variant"] for r in rows] == list(spartan_throughput.VARIANTS)
    assert all(r["instances_per_minute"] > 0 and r["trainable_params"] > 0 for r in rows)
  assert [r["method"] for r in result["finetune"]] == ["full", "spartan", "spartan", "houlsby",
                                                       "pfeiffer"]
  assert result["machine"]["cpu_count"] > 0 and result["machine"]["backend"] == "cpu"
  assert "finetune throughput" in capsys.readouterr().out
