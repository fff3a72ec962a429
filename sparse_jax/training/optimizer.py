"""Adam with linear warmup, cosine decay to zero and global-norm clipping (sigma-MoE App. B)."""

import ml_collections
import optax

from sparse_jax import validation


def validate_train_config(cfg: ml_collections.ConfigDict) -> None:
  """Checks the optimiser and loop fields of the `train` section."""
  for name in ("steps", "log_every", "ckpt_every", "eval_every", "keep_checkpoints"):
    validation.require_positive_int(cfg.get(name), f"train.{name}")
  warmup = cfg.get("warmup_steps")
  validation.require(isinstance(warmup, int) and 0 <= warmup < cfg.steps, "train.warmup_steps",
                     f"an integer in [0, train.steps={cfg.steps})", warmup)
  validation.require(isinstance(cfg.get("lr"), float) and cfg.lr > 0, "train.lr",
                     "a positive float", cfg.get("lr"))
  clip = cfg.get("grad_clip")
  validation.require(clip is None or (isinstance(clip, (int, float)) and clip > 0),
                     "train.grad_clip", "a positive number or None", clip)


def learning_rate_schedule(cfg: ml_collections.ConfigDict) -> optax.Schedule:
  """Linear warmup to `lr` over `warmup_steps`, then cosine decay to 0 at `steps`."""
  return optax.warmup_cosine_decay_schedule(
      init_value=0.0 if cfg.warmup_steps else cfg.lr, peak_value=cfg.lr,
      warmup_steps=cfg.warmup_steps, decay_steps=cfg.steps, end_value=0.0)


def make_optimizer(cfg: ml_collections.ConfigDict) -> optax.GradientTransformation:
  """Adam (PyTorch defaults, as in the paper) after global-norm clipping at `grad_clip`."""
  adam = optax.adam(learning_rate_schedule(cfg), b1=0.9, b2=0.999, eps=1e-8)
  if cfg.get("grad_clip") is None:
    return adam
  return optax.chain(optax.clip_by_global_norm(cfg.grad_clip), adam)
