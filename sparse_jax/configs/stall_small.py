"""The cheap stall probe of issue 73's recipe study: `stall_medium`'s schedule at the default's size.

`stall_medium` (quality_medium's first 1000 steps) tells a stalled seed, but costs 20-40 minutes
a run on a 2-core CPU, so no recipe was measured on more than 3 seeds. This probe keeps what
decides a stall there (the 4000-step schedule's warm-up to step 400 and near-peak rate after
it, judged at step 1000 by the training's stall rule over that warm-up) and halves the tokens a
step: the embedded default's model (`default.py`: d_model 256, 4 layers, context and memory 128;
sigma-MoE with 8 experts of 128, K 2, or its parameter-matched dense twin) at the default's
peak rate 2e-3. Whether its stalls and its ordering of recipes agree with `stall_medium` on the
recorded seeds is the first thing the study measures (`benchmarks/recipe_study.json`): they do
not on dense seed 1, where neither N(0, 1) nor `fan_in` copies by step 1000, and `fan_in` not
by step 2000 either (as many tokens as `stall_medium`'s step 1000), so this size and context
cannot tell a stall yet (benchmarks/history/2026-12-05_recipe_study.md).

The argument is `MODEL/RECIPE`: `MODEL` one of `VARIANTS`, `RECIPE` one name of `CHANGES` or
several joined by `+` (`fan_in+residual_zero`), each one change against the baseline, the
N(0, 1) token embedding that stalled (`STUDIED`).

    python -m benchmarks.stall_sweep --config=stall_small --models=dense,sigma_moe \
        --changes=baseline,fan_in --seeds=0-7 --out=benchmarks/recipe_study.json
    python train.py --config=stall_small:dense/fan_in+residual_zero --config.seed=3
"""

import math

from sparse_jax.configs import default, default_dense

VARIANTS = ("dense", "sigma_moe")
STEPS = 1000
SCHEDULE_STEPS = 4000  # As stall_medium's: warm-up to step 400, then cosine decay.
_D_MODEL, _N_LAYERS = 256, 4  # default.py's, which the changes below are sized for.

CHANGES = {
    "baseline": {},
    # The token embedding's draw: N(0, 1/d_model) (the default since 2026-11-29), the sigma-MoE
    # authors' Xavier, and scales between (d_model^-1/4 = 0.25, and 0.5).
    "fan_in": {"model.embed_init": "fan_in"},
    "xavier": {"model.embed_init": "xavier"},
    "embed_0.25": {"model.embed_init_scale": 0.25},
    "embed_0.5": {"model.embed_init_scale": 0.5},
    # A small draw read at N(0, 1)'s scale: Gemma's sqrt(d_model) multiplier on fan_in.
    "multiplier": {"model.embed_init": "fan_in", "model.embed_multiplier": math.sqrt(_D_MODEL)},
    # The residual outputs' init: GPT-2's 1/sqrt(2 n_layers), or zero (each block the identity).
    "residual_small": {"model.residual_init_scale": 1 / math.sqrt(2 * _N_LAYERS)},
    "residual_zero": {"model.residual_init_scale": 0.0},
    "xl_bias": {"model.xl_bias_init_std": 0.02},
    # The optimiser: warm-up, peak rate, clipping, Adam's beta2 and epsilon.
    "warmup_100": {"train.warmup_steps": 100},
    "warmup_800": {"train.warmup_steps": 800},
    "lr_half": {"train.lr": 1e-3},
    "lr_double": {"train.lr": 4e-3},
    "no_clip": {"train.grad_clip": None},
    "clip_1": {"train.grad_clip": 1.0},
    "beta2_0.98": {"train.adam_b2": 0.98},
    "beta2_0.95": {"train.adam_b2": 0.95},
    "eps_1e-6": {"train.adam_eps": 1e-6},
    "dropout": {"model.dropout": 0.1},
}

# The recipe the changes are made against: the N(0, 1) token embedding that stalled.
STUDIED = {"model.embed_init": "normal"}


def recipe_overrides(recipe: str) -> dict:
  """The dotted overrides of a `+`-joined recipe; a ValueError names an unknown change or two
  changes that set one field differently."""
  overrides = {}
  for change in recipe.split("+"):
    if change not in CHANGES:
      raise ValueError(f"stall_small.py: unknown change {change!r} in recipe {recipe!r}; "
                       f"changes: {tuple(CHANGES)}.")
    clash = {k for k, v in CHANGES[change].items() if overrides.get(k, v) != v}
    if clash:
      raise ValueError(f"stall_small.py: recipe {recipe!r} sets {sorted(clash)} twice.")
    overrides.update(CHANGES[change])
  return overrides


def get_config(arg: str = "dense/baseline"):
  model, _, recipe = arg.partition("/")
  if model not in VARIANTS or not recipe:
    raise ValueError(f"stall_small.py:MODEL/RECIPE needs MODEL one of {VARIANTS} and RECIPE "
                     f"one of {tuple(CHANGES)} or several joined by '+'; got {arg!r}.")
  overrides = recipe_overrides(recipe)
  config = default_dense.get_config() if model == "dense" else default.get_config()
  config.train.update(steps=STEPS, schedule_steps=SCHEDULE_STEPS,
                      warmup_steps=SCHEDULE_STEPS // 10, log_every=50, eval_every=250,
                      ckpt_every=250)
  config.eval.update(max_batches=20, copy_rows=16)  # stall_medium's evaluation and rule,
  config.eval.copy_stall_window = SCHEDULE_STEPS // 10  # judged over the warm-up's length.
  config.update_from_flattened_dict({**STUDIED, **overrides})
  return config
