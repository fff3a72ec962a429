"""benchmarks/length_generalization.py end to end at toy lengths and steps (its accuracies are
not checked here): the ablation model trains, scores both splits and is skipped when rerun."""

import json

from benchmarks import length_generalization


def tiny(get_config):
  """`get_config` with 1 + 1 layers of width 32 and a few examples, so the smoke test
  compiles and scores quickly."""

  def get(arg: str):
    config = get_config(arg)
    config.model.update(d_model=32, n_heads=2, n_encoder_layers=1, n_decoder_layers=1)
    config.data.update(batch_size=8, n_eval=8)
    config.eval.update(batch_size=8, max_batches=1, max_examples=8)
    return config

  return get


def test_ablation_run_scores_both_splits_and_is_not_redone(tmp_path, capsys, monkeypatch):
  monkeypatch.setattr(length_generalization.terraformer_arithmetic, "get_config",
                      tiny(length_generalization.terraformer_arithmetic.get_config))
  args = ["--tasks=copy", "--models=terraformer_sinusoid", "--steps=2", "--scale=16",
          f"--workdir={tmp_path / 'runs'}", f"--out={tmp_path / 'out.json'}"]
  length_generalization.main(args)
  rows = json.loads((tmp_path / "out.json").read_text())["rows"]
  assert [(r["task"], r["model"], r["steps"]) for r in rows] == [
      ("copy", "terraformer_sinusoid", 2)]
  assert rows[0]["train_digits"] == [2, 8] and rows[0]["test_digits"] == [16, 18]
  assert rows[0]["resumed_after_step"] == 0  # a fresh run
  assert all(0 <= rows[0][f"{split}_per_digit_accuracy"] <= 1 for split in ("validation", "test"))
  assert rows[0]["paper_per_digit_accuracy"] is None  # no paper number for the ablation
  length_generalization.main(args)  # finished: read back, not retrained
  assert json.loads((tmp_path / "out.json").read_text())["rows"] == rows
  assert "| copy | terraformer_sinusoid | 2 |" in capsys.readouterr().out
