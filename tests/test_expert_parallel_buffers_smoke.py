"""benchmarks/expert_parallel_buffers.py traces both exchanges on the simulated devices at toy
sizes and counts the buffers its collectives use."""

import json

from benchmarks import expert_parallel_buffers


def test_buffer_benchmark_writes_its_table(tmp_path, capsys):
  out = tmp_path / "buffers.json"
  result = expert_parallel_buffers.main(["--tokens=64", "--d_model=16", "--expert_size=8",
                                         "--recv_factors=2", f"--out={out}"])
  assert json.loads(out.read_text()) == result
  rows = {(r["mesh"], r["exchange"], r["recv_factor"]): r for r in result["rows"]}
  assert len(rows) == 6
  # 8 tokens and C = 16 slots per device; float32 x and y rows of 16 values, int32 expert
  # ids, float32 gates: the padded exchange sends and receives n_ep * C rows of each.
  padded = rows[("expert=8", "padded", None)]
  assert padded["fwd_send_bytes"] == padded["fwd_recv_bytes"] == 8 * 16 * (2 * 16 * 4 + 8)
  for mesh in ("expert=8", "data=2 x expert=4"):
    worst, bounded = rows[(mesh, "ragged", None)], rows[(mesh, "ragged", 2.0)]
    assert bounded["fwd_bytes"] < worst["fwd_bytes"] < rows[(mesh, "padded", None)]["fwd_bytes"]
    assert worst["fits"] == ["uniform", "skewed", "hot"] and "hot" not in bounded["fits"]
  assert "ragged x2" in capsys.readouterr().out
