"""The metrics log read back: later lines win, and a run's time sums over its invocations."""

import numpy as np
import pytest

from sparse_jax.training.metrics_log import (MetricsWriter, latest_records, logged_seconds,
                                             read_metrics)


def test_lines_round_trip_and_a_cut_line_is_dropped(tmp_path):
  writer = MetricsWriter(str(tmp_path))
  writer.write(2, "train", {"loss": 1.5})
  writer.close()
  with open(tmp_path / "metrics.jsonl", "a") as f:
    f.write('{"step": 3, "spl')  # A process killed mid-write.
  MetricsWriter(str(tmp_path)).close()
  assert read_metrics(str(tmp_path)) == [{"step": 2, "split": "train", "loss": 1.5}]


def test_a_missing_log_names_the_expected_path(tmp_path):
  with pytest.raises(FileNotFoundError, match="metrics.jsonl"):
    read_metrics(str(tmp_path))


def test_a_repeated_step_keeps_the_later_line():
  records = [{"step": 4, "split": "train", "loss": 2.0}, {"step": 2, "split": "train"},
             {"step": 4, "split": "validation"}, {"step": 4, "split": "train", "loss": 1.0}]
  assert [(r["step"], r.get("loss")) for r in latest_records(records, "train")] == [
      (2, None), (4, 1.0)]


def test_time_sums_the_lines_a_resumed_run_kept():
  """Invocation 1 logs steps 2 and 4 and is killed; invocation 2 resumes from step 2,
  repeats step 4 (compiling again) and logs 6. Only the kept lines count."""
  records = [
      {"step": 2, "split": "train", "train_seconds": 1.0, "compile_seconds": 5.0},
      {"step": 4, "split": "train", "train_seconds": 2.0},
      {"step": 4, "split": "validation", "eval_seconds": 0.5},
      {"step": 4, "split": "train", "train_seconds": 3.0, "compile_seconds": 7.0},
      {"step": 4, "split": "validation", "eval_seconds": 0.25},
      {"step": 6, "split": "train", "train_seconds": 4.0},
      {"step": 6, "split": "validation", "eval_seconds": 0.75},
  ]
  assert logged_seconds(records, items_per_step=64) == {
      "train": 8.0, "eval": 1.0, "compile": 12.0, "total": 21.0}


def test_lines_without_train_seconds_take_their_window_from_the_rate():
  """Lines of the loop before it timed its parts: each window's steps (since the previous
  kept line, also a short window where a run stopped) times the items per step, over the
  rate."""
  rates = {100: 1400.0, 200: 1650.0, 250: 1500.0, 300: 1200.0}
  records = [{"step": s, "split": "train", "tokens_per_second": r, "tflops_per_device": 0.03}
             for s, r in rates.items()]
  records.append({"step": 300, "split": "validation", "bits_per_byte": 1.5})
  expected = 4096 * (100 / 1400 + 100 / 1650 + 50 / 1500 + 50 / 1200)
  seconds = logged_seconds(records, items_per_step=4096)
  np.testing.assert_allclose([seconds["train"], seconds["total"]], [expected, expected])
  assert seconds["eval"] == seconds["compile"] == 0.0
