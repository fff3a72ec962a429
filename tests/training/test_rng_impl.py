"""Training with the rbg PRNG for dropout and routing (`train.rng_impl`): the loop runs, its
checkpoints restore, and a resumed run draws what an uninterrupted one drew."""

import jax
import numpy as np
from training_testing import patch_step, saved_params, sigterm_at, train_losses

from sparse_jax.tasks import train_and_evaluate
from sparse_jax.tasks.runs import evaluate_checkpoint


def test_rbg_run_resumes_exactly_and_its_checkpoint_evaluates(tiny_config, tmp_path,
                                                              monkeypatch):
  tiny_config.train.rng_impl = "rbg"
  straight, resumed = str(tmp_path / "straight"), str(tmp_path / "resumed")
  train_and_evaluate(tiny_config, straight)

  with monkeypatch.context() as m:
    patch_step(m, sigterm_at(2))
    assert train_and_evaluate(tiny_config, resumed) == {"step": 3, "interrupted": 1.0}
  final = train_and_evaluate(tiny_config, resumed)

  losses = train_losses(straight)
  assert train_losses(resumed) == losses and sorted(losses) == list(range(1, 7))
  assert all(np.isfinite(list(losses.values())))
  jax.tree.map(np.testing.assert_array_equal, saved_params(resumed, tiny_config),
               saved_params(straight, tiny_config))
  evaluated, _ = evaluate_checkpoint(resumed, split="validation")
  assert evaluated["step"] == 6 and np.isfinite(evaluated["loss"])
  assert np.isfinite(final["bits_per_byte"])


def test_rbg_run_learns_with_other_masks_than_threefry(tiny_config, tmp_path):
  """The option reaches the training step: the same seed and data, other dropout masks, so
  another first loss (the initialisation is the same); and the run learns."""
  tiny_config.train.update(steps=2, warmup_steps=1, ckpt_every=2)
  train_and_evaluate(tiny_config, str(tmp_path / "threefry"))
  tiny_config.train.update(steps=16, warmup_steps=2, lr=3e-3, ckpt_every=16, rng_impl="rbg")
  train_and_evaluate(tiny_config, str(tmp_path / "rbg"))
  threefry, rbg = train_losses(tmp_path / "threefry"), train_losses(tmp_path / "rbg")
  assert threefry[1] != rbg[1]
  first, last = np.mean([rbg[s] for s in (1, 2, 3)]), np.mean([rbg[s] for s in (14, 15, 16)])
  assert last < first - 0.4, (first, last)  # ~5.8 -> ~4.9 nats
