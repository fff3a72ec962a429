"""The `train` section: the optimiser with global-norm clipping and a learning-rate schedule.

Optimisers: Adam (PyTorch's defaults; sigma-MoE, SPARTAN), AdamW (PyTorch's `AdamW`, MoEUT)
or Adafactor as Trax configures it for Terraformer (`scientific_papers_terraformer.gin`: no
momentum, decay rate 0.9, update clipping 1.0, factored second moments, updates scaled by the
parameters' RMS).

Schedules, after a linear warmup to `lr` over `warmup_steps`: cosine decay to zero (sigma-MoE
App. B), or to `end_lr_fraction * lr` (MoEUT: 0.1); linear decay to zero (the Hugging Face
Trainer's default, which the SPARTAN reference runs); or "rsqrt", Trax's `constant *
linear_warmup * rsqrt_decay`: `lr * sqrt(warmup_steps / max(t, warmup_steps))`, which never
reaches zero.

Weight decay (`weight_decay` r) with Adam and Adafactor is Trax's rule: after the update,
every weight is multiplied by `1 - r` each step, whatever the learning rate
(`w <- (1 - r) w - update`); Terraformer trains with r = 1e-5. With AdamW it is AdamW's,
`w <- w - lr_t r w` besides the update (scaled by the schedule; MoEUT: r = 0.01). Neither is
L2 added to the gradient.
"""

import dataclasses
from typing import Literal

import jax.numpy as jnp
import optax

from sparse_jax import schema, validation
from sparse_jax.models.rngs import RNG_IMPLS
from sparse_jax.training import profiling


SCHEDULES = ("cosine", "linear", "rsqrt")
OPTIMIZERS = ("adam", "adamw", "adafactor")


class TrainConfig(schema.Schema):
  """The `train` section: the optimiser and the loop's cadence (every `*_every` in steps).

  `warmup_steps` must be below `steps`; configs derive it from `steps` (a `FieldReference`)
  so that a short run (`--config.train.steps=20`) warms up proportionally.
  """

  steps: schema.PositiveInt  # Optimiser steps of the run.
  lr: schema.PositiveFloat  # The peak learning rate, reached at the end of the warmup.
  warmup_steps: schema.NonNegativeInt = 0  # Steps of linear warmup from 0 to lr.
  # The step where the schedule ends; None: `steps`. A larger value trains the first `steps`
  # of a longer run exactly as that run would (`sparse_jax/configs/stall_medium.py`).
  schedule_steps: schema.PositiveInt | None = None
  schedule: Literal[SCHEDULES] = "cosine"  # The decay after the warmup (module docstring).
  end_lr_fraction: schema.Probability = 0.0  # cosine only: where it ends, a fraction of lr.
  optimizer: Literal[OPTIMIZERS] = "adam"  # Adam, AdamW or Adafactor (module docstring).
  grad_clip: schema.PositiveFloat | None = None  # Clip the gradients' global norm; None: no.
  # Adam's (and AdamW's) decay rates of the first and second moments and its epsilon.
  adam_b1: schema.Probability = 0.9
  adam_b2: schema.Probability = 0.999  # The second moment's decay rate.
  adam_eps: schema.PositiveFloat = 1e-8  # Added to the second moment's root.
  # Weight decay (module docstring): Trax's w <- (1 - weight_decay) w every step, or with
  # adamw AdamW's; 0: none.
  weight_decay: schema.Probability = 0.0
  log_every: schema.PositiveInt  # Steps between logged training metrics (the only host syncs).
  eval_every: schema.PositiveInt  # Steps between evaluations (also one at the end).
  ckpt_every: schema.PositiveInt  # Steps between checkpoints (also one at the end).
  keep_checkpoints: schema.PositiveInt = 2  # The newest checkpoints kept in WORKDIR/checkpoints.
  # Micro-batches per step (along the batch axis), gradients averaged (docs/training.md "Gradient
  # accumulation").
  grad_accum_steps: schema.PositiveInt = 1
  # A jax.profiler trace of steps START + 1 .. STOP into WORKDIR/profile (`training.profiling`):
  # "START,STOP" (`--config.train.profile_steps=10,15`) or (START, STOP); None: no profile.
  profile_steps: tuple[schema.NonNegativeInt, schema.NonNegativeInt] | str | None = None
  # The PRNG of the dropout and routing streams (`models.rngs`): "rbg" / "unsafe_rbg" draw
  # masks with XLA's RngBitGenerator, other ones than threefry's (docs/training.md "Dropout
  # PRNG").
  rng_impl: Literal[RNG_IMPLS] = "threefry"

  def check(self, path: str) -> None:
    validation.require(self.warmup_steps < self.steps, f"{path}.warmup_steps",
                       f"an integer in [0, {path}.steps={self.steps})", self.warmup_steps)
    validation.require(self.schedule_steps is None or self.schedule_steps >= self.steps,
                       f"{path}.schedule_steps", f"None or >= {path}.steps={self.steps}",
                       self.schedule_steps)
    profiling.parse_steps(self.profile_steps, f"{path}.profile_steps", self.steps)
    defaults = {field.name: field.default for field in dataclasses.fields(self)}
    validation.require(
        self.optimizer != "adafactor" or all(getattr(self, name) == defaults[name]
                                             for name in ("adam_b1", "adam_b2", "adam_eps")),
        f"{path}.optimizer", "'adam' or 'adamw' where adam_b1, adam_b2 or adam_eps are set",
        self.optimizer)
    validation.require(self.end_lr_fraction == 0 or self.schedule == "cosine",
                       f"{path}.end_lr_fraction", "0 unless schedule is 'cosine'",
                       self.end_lr_fraction)

  @property
  def schedule_end(self) -> int:
    """Where the learning-rate schedule ends: `schedule_steps`, or `steps`."""
    return self.steps if self.schedule_steps is None else self.schedule_steps

  @property
  def profile_window(self) -> tuple[int, int] | None:
    """`profile_steps` as `(START, STOP)`, or None."""
    return profiling.parse_steps(self.profile_steps, "train.profile_steps", self.steps)


class BatchedTrainConfig(TrainConfig):
  """A `train` section that also sets the batch size (tasks whose `data` section does not)."""

  batch_size: schema.PositiveInt  # Examples per optimiser step, over all devices.


def learning_rate_schedule(cfg: TrainConfig) -> optax.Schedule:
  """Linear warmup to `lr` over `warmup_steps`, then `schedule` decay to 0 at `steps` (or at
  `schedule_steps`, past the end of training).

  "linear" is `transformers.get_linear_schedule_with_warmup`: `lr * (end - t) / (end -
  warmup_steps)` after the warmup. "rsqrt" peaks at `lr` at the end of the warmup, then decays
  as `1 / sqrt(t)` (no end).
  """
  if cfg.schedule == "rsqrt":
    warmup = max(cfg.warmup_steps, 1)
    return lambda t: cfg.lr * jnp.minimum(1.0, t / warmup) * jnp.sqrt(
        warmup / jnp.maximum(t, warmup))
  if cfg.schedule == "cosine":
    return optax.warmup_cosine_decay_schedule(
        init_value=0.0 if cfg.warmup_steps else cfg.lr, peak_value=cfg.lr,
        warmup_steps=cfg.warmup_steps, decay_steps=cfg.schedule_end,
        end_value=cfg.end_lr_fraction * cfg.lr)
  decay = optax.linear_schedule(cfg.lr, 0.0, cfg.schedule_end - cfg.warmup_steps)
  if not cfg.warmup_steps:
    return decay
  warmup = optax.linear_schedule(0.0, cfg.lr, cfg.warmup_steps)
  return optax.join_schedules([warmup, decay], [cfg.warmup_steps])


def decay_weights_every_step(rate: float) -> optax.GradientTransformation:
  """Trax's weight decay, chained after the optimiser's (learning-rate scaled) update `u`:
  `u - rate * w`, so that applying it gives `(1 - rate) w + u` (`trax/optimizers/adam.py`,
  `adafactor.py`: `new_weights = (1 - weight_decay_rate) * weights - subtrahend`)."""
  return optax.add_decayed_weights(-rate)


def make_optimizer(cfg: TrainConfig) -> optax.GradientTransformation:
  """`cfg.optimizer` (module docstring) after global-norm clipping at `grad_clip`, with
  Trax's weight decay when `weight_decay > 0`."""
  schedule = learning_rate_schedule(cfg)
  if cfg.optimizer == "adafactor":
    optimizer = optax.adafactor(schedule, decay_rate=0.9, clipping_threshold=1.0, momentum=None,
                                multiply_by_parameter_scale=True, factored=True, eps=1e-16)
  elif cfg.optimizer == "adamw":
    optimizer = optax.adamw(schedule, b1=cfg.adam_b1, b2=cfg.adam_b2, eps=cfg.adam_eps,
                            weight_decay=cfg.weight_decay)
  else:
    optimizer = optax.adam(schedule, b1=cfg.adam_b1, b2=cfg.adam_b2, eps=cfg.adam_eps)
  parts = [optax.clip_by_global_norm(cfg.grad_clip)] if cfg.grad_clip is not None else []
  parts.append(optimizer)
  if cfg.weight_decay and cfg.optimizer != "adamw":
    parts.append(decay_weights_every_step(cfg.weight_decay))
  return parts[0] if len(parts) == 1 else optax.chain(*parts)
