"""bfloat16 training follows float32 training (the full measurement on the embedded default
is `benchmarks/mixed_precision.py`, in RESULTS.md)."""

import numpy as np
from training_testing import train_losses

from sparse_jax.tasks import train_and_evaluate


def test_bfloat16_loss_curve_follows_float32(tiny_config, tmp_path):
  """40 steps of the tiny sigma-MoE LM from one seed in each dtype: the loss falls by over a
  nat in both, and the curves stay within 0.1 nats of each other at every step (bfloat16
  rounds activations to 8 mantissa bits, about 0.4% relative: measured here up to ~0.03)."""
  tiny_config.model.dropout = 0.0
  tiny_config.train.update(steps=40, warmup_steps=4, lr=3e-3, ckpt_every=40, log_every=2)
  losses = {}
  for dtype in ("float32", "bfloat16"):
    tiny_config.model.dtype = dtype
    train_and_evaluate(tiny_config, str(tmp_path / dtype))
    losses[dtype] = train_losses(tmp_path / dtype)
  f32, bf16 = (np.array([losses[d][s] for s in sorted(losses["float32"])]) for d in losses)
  assert bf16[-1] < bf16[0] - 1.0 and f32[-1] < f32[0] - 1.0
  assert np.max(np.abs(bf16 - f32)) < 0.1, np.abs(bf16 - f32)
