"""The `train` section, and Adam with linear warmup, cosine decay to zero and global-norm
clipping (sigma-MoE App. B)."""

import dataclasses

import optax

from sparse_jax import schema, validation


@dataclasses.dataclass(frozen=True, kw_only=True)
class TrainConfig(schema.Schema):
  """The `train` section: the optimiser and the loop's cadence (every `*_every` in steps).

  `warmup_steps` must be below `steps`; configs derive it from `steps` (a `FieldReference`)
  so that a short run (`--config.train.steps=20`) warms up proportionally.
  """

  steps: schema.PositiveInt
  lr: schema.PositiveFloat
  warmup_steps: schema.NonNegativeInt = 0
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
  """Linear warmup to `lr` over `warmup_steps`, then cosine decay to 0 at `steps`."""
  return optax.warmup_cosine_decay_schedule(
      init_value=0.0 if cfg.warmup_steps else cfg.lr, peak_value=cfg.lr,
      warmup_steps=cfg.warmup_steps, decay_steps=cfg.steps, end_value=0.0)


def make_optimizer(cfg: TrainConfig) -> optax.GradientTransformation:
  """Adam (PyTorch defaults, as in the paper) after global-norm clipping at `grad_clip`."""
  adam = optax.adam(learning_rate_schedule(cfg), b1=0.9, b2=0.999, eps=1e-8)
  if cfg.grad_clip is None:
    return adam
  return optax.chain(optax.clip_by_global_norm(cfg.grad_clip), adam)
