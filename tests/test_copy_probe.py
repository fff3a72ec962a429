"""benchmarks/copy_probe.py: its scoring (`sparse_jax.tasks.copy_score`) against hand-built
copiers, and a run end to end."""

import json
import math

import numpy as np
import pytest

from benchmarks import copy_probe
from sparse_jax.tasks import train_and_evaluate
from sparse_jax.tasks.copy_score import copy_bits, repeated_slices

VOCAB = 256


def _copier_logits(x_bt: np.ndarray, shift: int) -> np.ndarray:
  """Uniform logits on the first copy; on the second, all mass on `x[i - half + shift]` at
  position `i` (`shift=1`: the right token, a perfect copier; `shift=0`: one token late)."""
  rows, length = x_bt.shape
  half = length // 2
  logits = np.zeros((rows, length - 1, VOCAB))
  for i in range(half, length - 1):
    logits[np.arange(rows), i, x_bt[:, i - half + shift]] = 50.0
  return logits


def test_repeated_slices_are_a_slice_and_its_repeat():
  tokens = np.arange(1000) % 251
  x_bt = repeated_slices(tokens, rows=5, half=32, seed=3)
  assert x_bt.shape == (5, 64)
  np.testing.assert_array_equal(x_bt[:, :32], x_bt[:, 32:])
  for row in x_bt:  # consecutive tokens of `tokens`
    start = int(np.flatnonzero(tokens == row[0])[0])
    np.testing.assert_array_equal(row[:32], tokens[start:start + 32])
  with pytest.raises(ValueError, match="half=2000 is longer than the split"):
    repeated_slices(tokens, rows=1, half=2000, seed=0)


def test_a_perfect_copier_scores_zero_on_the_second_copy_and_a_late_one_does_not():
  rng = np.random.default_rng(0)
  x_bt = repeated_slices(rng.integers(0, VOCAB, 5000), rows=4, half=40, seed=1)
  first, second = copy_bits(_copier_logits(x_bt, shift=1), x_bt, skip=5)
  assert first == pytest.approx(math.log2(VOCAB))  # uniform over the vocabulary
  assert second == pytest.approx(0.0, abs=1e-6)
  _, late = copy_bits(_copier_logits(x_bt, shift=0), x_bt, skip=5)
  assert late > 30  # the wrong token at logit 50 above the rest: ~50 / ln 2 bits


def test_the_probe_runs_on_a_trained_checkpoint(tiny_config, tmp_path, capsys):
  workdir = str(tmp_path / "run")
  train_and_evaluate(tiny_config, workdir)
  out = tmp_path / "copy_probe.json"
  result = copy_probe.main([workdir, "--rows=2", "--half=12", "--skip=2", f"--out={out}"])
  (run,) = result["runs"]
  assert run["step"] == tiny_config.train.steps
  assert 0 < run["first_copy_bits"] < 20 and 0 < run["second_copy_bits"] < 20
  assert json.loads(out.read_text())["runs"] == result["runs"]
  assert "second / first" in capsys.readouterr().out
  earlier = copy_probe.main([workdir, "--step=3", "--rows=2", "--half=12", "--skip=2",
                            f"--out={out}"])
  assert earlier["runs"][0]["step"] == 3
  assert earlier["runs"][0]["first_copy_bits"] != run["first_copy_bits"]
  with pytest.raises(SystemExit):
    copy_probe.main([workdir, "--half=12", "--skip=12"])
