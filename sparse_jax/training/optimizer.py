"""The `train` section, and Adam with global-norm clipping and a learning-rate schedule:
linear warmup then cosine decay to zero (sigma-MoE App. B), or linear decay to zero (the
Hugging Face Trainer's default, which the SPARTAN reference runs).
"""

import dataclasses
from typing import Literal

import optax

from sparse_jax import schema, validation


SCHEDULES = ("cosine", "linear")


@dataclasses.dataclass(frozen=True, kw_only=True)
class TrainConfig(schema.Schema):
  """The `train` section: the optimiser and the loop's cadence (every `*_every` in steps).

  `warmup_steps` must be below `steps`; configs derive it from `steps` (a `FieldReference`)
  so that a short run (`--config.train.steps=20`) warms up proportionally.
  """

  steps: schema.PositiveInt
  lr: schema.PositiveFloat
  warmup_steps: schema.NonNegativeInt = 0
  schedule: Literal[SCHEDULES] = "cosine"  # The decay after the warmup (module docstring).
  grad_clip: schema.PositiveFloat | None = None
  log_every: schema.PositiveInt
  eval_every: schema.PositiveInt
  ckpt_every: schema.PositiveInt
  keep_checkpoints: schema.PositiveInt = 2

  def check(self, path: str) -> None:
    validation.require(self.warmup_steps < self.steps, f"{path}.warmup_steps",
                       f"an integer in [0, {path}.steps={self.steps})", self.warmup_steps)


@dataclasses.dataclass(frozen=True, kw_only=True)
class BatchedTrainConfig(TrainConfig):
  """A `train` section that also sets the batch size (tasks whose `data` section does not)."""

  batch_size: schema.PositiveInt


def learning_rate_schedule(cfg: TrainConfig) -> optax.Schedule:
  """Linear warmup to `lr` over `warmup_steps`, then `schedule` decay to 0 at `steps`.

  "linear" is `transformers.get_linear_schedule_with_warmup`: `lr * (steps - t) / (steps -
  warmup_steps)` after the warmup.
  """
  if cfg.schedule == "cosine":
    return optax.warmup_cosine_decay_schedule(
        init_value=0.0 if cfg.warmup_steps else cfg.lr, peak_value=cfg.lr,
        warmup_steps=cfg.warmup_steps, decay_steps=cfg.steps, end_value=0.0)
  decay = optax.linear_schedule(cfg.lr, 0.0, cfg.steps - cfg.warmup_steps)
  if not cfg.warmup_steps:
    return decay
  warmup = optax.linear_schedule(0.0, cfg.lr, cfg.warmup_steps)
  return optax.join_schedules([warmup, decay], [cfg.warmup_steps])


def make_optimizer(cfg: TrainConfig) -> optax.GradientTransformation:
  """Adam (PyTorch defaults, as in the paper) after global-norm clipping at `grad_clip`."""
  adam = optax.adam(learning_rate_schedule(cfg), b1=0.9, b2=0.999, eps=1e-8)
  if cfg.grad_clip is None:
    return adam
  return optax.chain(optax.clip_by_global_norm(cfg.grad_clip), adam)
