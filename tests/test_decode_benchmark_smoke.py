"""benchmarks/decode.py runs end to end at toy sizes (its timings are not checked here)."""

import json
import sys

from benchmarks import decode


def test_decode_benchmark_writes_its_table(tmp_path, monkeypatch, capsys):
  out = tmp_path / "decode.json"
  monkeypatch.setattr(sys, "argv", ["decode.py", "--d_model=32", "--layers=1", "--context=4",
                                    "--repeats=2", f"--out={out}"])
  decode.main()
  result = json.loads(out.read_text())
  assert [r["variant"] for r in result["rows"]] == list(decode.VARIANTS)
  assert all(r["block_ms"] > 0 and r["model_ms"] > 0 for r in result["rows"])
  assert "sparse_ff_qkv" in capsys.readouterr().out
