"""Learning curves from `metrics.jsonl` files written by the real `MetricsWriter`, checked
against the files parsed here with plain `json`."""

import json
import os

import pytest

from sparse_jax.figures import learning_curves
from sparse_jax.training.metrics_log import MetricsWriter


def _write_run(run_dir, losses, evals, repeat_from=None):
  writer = MetricsWriter(str(run_dir))
  for step, loss in losses.items():
    writer.write(step, "train", {"loss": loss, "bits_per_byte": loss / 0.693})
  for step, loss in evals.items():
    writer.write(step, "validation", {"loss": loss})
  if repeat_from is not None:  # a resumed run logs these steps again
    for step in range(repeat_from, max(losses) + 1):
      writer.write(step, "train", {"loss": losses[step] + 1.0})
  writer.close()


def test_curves_of_two_runs_match_their_files(tmp_path):
  _write_run(tmp_path / "a", {1: 5.0, 2: 4.0, 3: 3.5}, {3: 3.9})
  _write_run(tmp_path / "b", {1: 5.5, 2: 4.5, 3: 4.0, 4: 3.0}, {}, repeat_from=3)
  paths = learning_curves.make_learning_curves([str(tmp_path / "a"), str(tmp_path / "b")],
                                               str(tmp_path / "out"))
  numbers = json.loads(open(paths["json"]).read())
  with open(paths["png"], "rb") as f:
    assert f.read(8) == b"\x89PNG\r\n\x1a\n"
  assert os.path.getsize(paths["png"]) > 1000

  expected = {}
  for name in ("a", "b"):
    lines = [json.loads(l) for l in open(tmp_path / name / "metrics.jsonl")]
    per_split = {}
    for line in lines:  # the last line of a step wins
      per_split.setdefault(line["split"], {})[line["step"]] = line["loss"]
    expected[name] = {split: {"steps": sorted(p), "values": [p[s] for s in sorted(p)]}
                      for split, p in per_split.items()}
  assert [run["label"] for run in numbers["runs"]] == ["a", "b"]
  assert {run["label"]: run["series"] for run in numbers["runs"]} == expected
  assert expected["b"]["train"]["values"] == [5.5, 4.5, 5.0, 4.0]  # repeated steps: later


def test_a_repeated_step_without_the_metric_drops_its_stale_value(tmp_path):
  """Run b's resumed lines for steps 3-4 log no bits_per_byte: the values those steps had
  before the resume belong to discarded training and must not be plotted."""
  _write_run(tmp_path / "b", {1: 5.5, 2: 4.5, 3: 4.0, 4: 3.0}, {}, repeat_from=3)
  curves = learning_curves.compute_learning_curves([str(tmp_path / "b")], "bits_per_byte")
  assert curves["runs"][0]["series"] == {
      "train": {"steps": [1, 2], "values": [5.5 / 0.693, 4.5 / 0.693]}}


def test_missing_file_and_unknown_metric_are_named(tmp_path):
  with pytest.raises(FileNotFoundError, match="no metrics.jsonl in .*nowhere"):
    learning_curves.compute_learning_curves([str(tmp_path / "nowhere")])
  _write_run(tmp_path / "a", {1: 5.0}, {})
  with pytest.raises(ValueError, match=r"'perplexity'.*\['bits_per_byte', 'loss'\]"):
    learning_curves.compute_learning_curves([str(tmp_path / "a")], "perplexity")


def test_labels_are_the_shortest_path_ends_that_tell_runs_apart():
  assert learning_curves.run_labels(["r/dense/seed0", "r/sigma_moe/seed0/"]) == [
      "dense/seed0", "sigma_moe/seed0"]
  assert learning_curves.run_labels(["runs/a", "runs/b"]) == ["a", "b"]
