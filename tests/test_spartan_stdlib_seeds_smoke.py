"""benchmarks/spartan_stdlib_seeds.py end to end at toy sizes: backbone, methods over seeds,
the table and the JSON, and a second invocation that keeps finished methods."""

import json

from benchmarks import spartan_stdlib_seeds
from sparse_jax.configs import spartan_stdlib
from tests.lm_testing import tiny_lm_config


def test_seeds_benchmark_runs_each_method_over_the_seeds_once(stdlib_slice, tmp_path,
                                                               monkeypatch, capsys):
  data_dir = str(tmp_path / "tfds")
  backbone = tiny_lm_config(stdlib_slice, data_dir)
  backbone.train.update(steps=2, warmup_steps=1, ckpt_every=2)

  full_size = spartan_stdlib.get_config

  def tiny_finetune(method):
    config = full_size(method)
    config.task.update(data_dir=data_dir, snippet_bytes=32, max_len=32)  # the real stdlib
    config.method.spartan.update(n_parents=4, n_children=2, top_k=2)
    config.method.adapter.bottleneck = 4
    config.train.update(steps=2, batch_size=4, log_every=1, ckpt_every=2)
    config.eval.update(batch_size=4, max_examples=8)
    config.mesh.data = 1
    return config

  monkeypatch.setattr(spartan_stdlib_seeds.default, "get_config", lambda: backbone)
  monkeypatch.setattr(spartan_stdlib_seeds.spartan_stdlib, "get_config", tiny_finetune)
  out = tmp_path / "seeds.json"
  args = [f"--workdir={tmp_path / 'runs'}", f"--out={out}", "--seeds=0,1"]
  spartan_stdlib_seeds.main([*args, "--methods=spartan"])
  rows = json.loads(out.read_text())["rows"]
  assert [r["method"] for r in rows] == ["spartan"]
  for row in rows:
    accuracies = [m["accuracy"] for m in row["per_seed"].values()]
    assert row["seeds"] == [0, 1] and len(accuracies) == 2
    assert row["accuracy_mean"] == sum(accuracies) / 2
  spartan_stdlib_seeds.main([*args, "--methods=spartan,pfeiffer"])  # spartan kept, not rerun
  rows_again = json.loads(out.read_text())["rows"]
  assert rows_again[:1] == rows and rows_again[1]["method"] == "pfeiffer"
  assert rows_again[0]["trainable_params"] != rows_again[1]["trainable_params"]
  assert "matthews" in capsys.readouterr().out
