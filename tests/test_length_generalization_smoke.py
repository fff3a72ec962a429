"""benchmarks/length_generalization.py end to end at toy lengths and steps (its accuracies are
not checked here): the ablation model trains, scores both splits and is skipped when rerun."""

import json

import numpy as np

from benchmarks import length_generalization, seq2seq_answers
from sparse_jax.data import arithmetic


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
  assert 0 < rows[0]["run_minutes"] <= rows[0]["train_minutes"]  # logged parts of its wall time
  assert all(0 <= rows[0][f"{split}_per_digit_accuracy"] <= 1 for split in ("validation", "test"))
  assert rows[0]["paper_per_digit_accuracy"] is None  # no paper number for the ablation
  length_generalization.main(args)  # finished: read back, not retrained
  assert json.loads((tmp_path / "out.json").read_text())["rows"] == rows
  assert "| copy | terraformer_sinusoid | 2 |" in capsys.readouterr().out
  answers = seq2seq_answers.main([str(tmp_path / "runs" / "copy_terraformer_sinusoid"),
                                  "--examples=2", f"--out={tmp_path / 'answers.json'}"])
  assert len(answers) == 2 and all(16 <= r["target_len"] <= 18 for r in answers)
  assert json.loads((tmp_path / "answers.json").read_text())["rows"] == answers


def test_answer_errors_tell_early_stops_slips_and_repeats_apart():
  """Hand-made answers to the target 2 3 4 5 6 7 (EOS 1, PAD 0 after it)."""
  target = np.array([2, 3, 4, 5, 6, 7, 1, 0])
  errors = seq2seq_answers.answer_errors
  assert errors(target, target) == {"target_len": 6, "answer_len": 6, "first_error": 6,
                                    "aligned": None, "skipped": None, "repeated": None}
  stopped = errors(target, np.array([2, 3, 4, 1, 0, 0, 0, 0]))
  assert (stopped["answer_len"], stopped["first_error"], stopped["aligned"]) == (3, 3, None)
  skipped = errors(target, np.array([2, 3, 5, 6, 7, 1, 0, 0]))  # dropped the 4
  assert (skipped["first_error"], skipped["skipped"], skipped["aligned"]) == (2, 1.0, 0.0)
  repeated = errors(target, np.array([2, 3, 3, 4, 5, 6, 7, 1]))  # wrote the 3 twice
  assert (repeated["first_error"], repeated["repeated"]) == (2, 1.0)
  assert errors(target, np.array([9, 3, 4, 5, 6, 7, 1, 0]))["aligned"] == 5 / 6  # one wrong


def test_add_regions_count_the_digits_that_need_both_operands_apart():
  """1375 + 48 = 1423: lower-endian inputs 5 7 3 1 | 8 4, sum 3 2 4 1, of which the first
  two digits need both operands and the last two only 1375's digits and the carry."""
  digits = arithmetic.digit_tokens
  inputs = np.concatenate([digits([5, 7, 3, 1]), [arithmetic.SEPARATOR], digits([8, 4]),
                           [arithmetic.EOS]])
  assert 1375 + 48 == arithmetic.lower_endian_value([3, 2, 4, 1])
  target = np.append(digits([3, 2, 4, 1]), arithmetic.EOS)
  regions = seq2seq_answers.add_regions
  assert regions(inputs, target, target) == {"both_right": 2, "both_digits": 2,
                                             "longer_right": 2, "longer_digits": 2}
  wrong_first = np.append(digits([4, 2, 4, 1]), arithmetic.EOS)
  assert regions(inputs, target, wrong_first)["both_right"] == 1
  stopped_early = np.append(digits([3, 2, 4]), arithmetic.EOS)  # the missing digit is wrong
  assert regions(inputs, target, stopped_early)["longer_right"] == 1
  copied_operand = np.append(digits([5, 7, 3, 1]), arithmetic.EOS)  # 1375, not the sum:
  assert regions(inputs, target, copied_operand) == {"both_right": 0, "both_digits": 2,
                                                     "longer_right": 1, "longer_digits": 2}


def test_add_regions_split_random_sums_at_the_shorter_operand():
  """Random additions from the task's own generator: an exact answer is right everywhere, and
  the regions' sizes are the shorter operand's digit count and the rest of the sum's."""
  rng = np.random.default_rng(0)
  for n_digits in rng.integers(2, 40, size=20):
    inputs, target = arithmetic.add_tokens(rng, int(n_digits))
    separator = list(inputs).index(arithmetic.SEPARATOR)
    digits = inputs - arithmetic.FIRST_DIGIT
    a, b = digits[:separator], digits[separator + 1:]
    total = arithmetic.lower_endian_value(a) + arithmetic.lower_endian_value(b)
    shorter = min(len(a), len(b))
    assert len(target) == len(str(total))
    exact = np.append(target, arithmetic.EOS)
    regions = seq2seq_answers.add_regions(np.append(inputs, arithmetic.EOS), exact, exact)
    assert regions == {"both_right": shorter, "both_digits": shorter,
                       "longer_right": len(target) - shorter,
                       "longer_digits": len(target) - shorter}
