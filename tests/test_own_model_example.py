"""examples/own_moe_lm.py, the README's example of our sigma-MoE layer in a user's own Flax
model: a few steps on a text file the test writes learn its bytes, and the layers' `aux`
reaches the loop (every token's k expert slots counted, the regulariser reported)."""

import os
import runpy

import numpy as np
import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SMALL = ["--batch=8", "--seq_len=32", "--d_model=32", "--heads=2", "--layers=2", "--experts=4",
         "--expert_size=16", "--k=2", "--log_every=20"]


def _example_main():
  """The example's `main` (examples/ is no package)."""
  return runpy.run_path(os.path.join(REPO, "examples", "own_moe_lm.py"))["main"]


def _text(seed: int = 0) -> str:
  """Sentences from a small vocabulary: far more predictable than uniform bytes."""
  rng = np.random.default_rng(seed)
  words = ["the", "expert", "router", "picks", "two", "of", "eight", "tokens", "layer", "and"]
  return " ".join(rng.choice(words, size=3000)) + "\n"


def test_a_few_steps_learn_the_file_and_count_every_expert_slot(tmp_path, capsys):
  path = tmp_path / "my_text.txt"
  path.write_text(_text())
  result = _example_main()([str(path), "--steps=40", *SMALL])
  assert result["val_loss"] < np.log(256) - 2  # uniform bytes: log 256 nats
  assert result["usage"].shape == (2, 4)
  assert (result["usage"].sum(axis=1) == 8 * 32 * 2).all()  # batch x tokens x k slots per layer
  assert np.isfinite(result["reg_loss"]) and result["reg_loss"] != 0
  printed = capsys.readouterr().out
  assert "step 40: loss" in printed and "layer 1 expert usage" in printed


def test_a_file_too_short_for_a_window_is_named(tmp_path):
  path = tmp_path / "short.txt"
  path.write_text("too short")
  with pytest.raises(SystemExit, match="short.txt: 9 bytes is too short for --seq_len=32"):
    _example_main()([str(path), *SMALL])
