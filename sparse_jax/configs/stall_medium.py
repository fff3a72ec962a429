"""`quality_medium`'s first 1000 steps: the shortest run that tells a stalled seed (issue 61).

3 of the 12 `quality_medium` runs stalled just after the warm-up's peak and never caught up,
each with a weak or missing copy mechanism (benchmarks/history/2026-11-28_quality_medium.md).
They part from the others at steps 600-1000, and at step 1000 the training's stall rule
(`sparse_jax.tasks.copy_score.StallRule`) tells them apart: so this trains the same runs, on the
same 4000-step schedule, for their first 1000 steps (a quarter of the time), evaluating every
250 steps on 20 batches. Smaller models do not learn to copy by step 1000 (4.1M tokens) at
all, stalled or not, so they cannot tell a stall (three tried: benchmarks/history/
2026-11-28_stall.md and 2026-12-05_recipe_study.md); so this is also the probe of issue 73's
recipe study.

The argument is `MODEL/RECIPE`: `MODEL` one of `quality_medium.VARIANTS` ("dense",
"sigma_moe"), `RECIPE` one name of `CHANGES` or several joined by `+` (`fan_in+residual_zero`),
each one thing changed against the recipe the stalled runs trained ("baseline":
`quality_medium` with the N(0, 1) token embedding that was the default until the fix,
`STUDIED`). `benchmarks/stall_sweep.py` trains them over seeds and counts the stalls.

    python -m benchmarks.stall_sweep --models=dense,sigma_moe --changes=baseline,fan_in --seeds=0-5
    sparse-jax train --config=stall_medium:dense/fan_in+residual_zero --config.seed=1
"""

import math

import ml_collections

from sparse_jax.configs import paper_training, quality_medium

VARIANTS = quality_medium.VARIANTS
STEPS = 1000
SCHEDULE_STEPS = 4000  # quality_medium's: its warm-up (10%) and cosine decay.
_D_MODEL, _N_LAYERS = 256, 4  # quality_medium's, which the changes below are sized for.


def _authors_model() -> dict:
  """`paper_training.authors_transformer_xl`'s fields as dotted overrides."""
  model = ml_collections.ConfigDict()
  paper_training.authors_transformer_xl(model)
  return {f"model.{name}": value for name, value in model.items()}


CHANGES = {
    "baseline": {},
    # The token embedding's draw: N(0, 1/d_model) (the fix, now the default: the same draw
    # scaled by 1/16), the sigma-MoE authors' Xavier, and scales between (0.25 and 0.5).
    "fan_in": {"model.embed_init": "fan_in"},
    "xavier": {"model.embed_init": "xavier"},
    "embed_0.25": {"model.embed_init_scale": 0.25},
    "embed_0.5": {"model.embed_init_scale": 0.5},
    # A small draw read at N(0, 1)'s scale: Gemma's sqrt(d_model) multiplier on fan_in.
    "multiplier": {"model.embed_init": "fan_in", "model.embed_multiplier": math.sqrt(_D_MODEL)},
    # embed_0.25's scale read from the fan_in draw: Adam moves it 4x faster (relative to its
    # size) than embed_0.25's N(0, 1/16) draw.
    "multiplier_4": {"model.embed_init": "fan_in",
                     "model.embed_multiplier": math.sqrt(_D_MODEL) / 4},
    # The residual outputs' init: GPT-2's 1/sqrt(2 n_layers), or zero (each block the identity).
    "residual_small": {"model.residual_init_scale": 1 / math.sqrt(2 * _N_LAYERS)},
    "residual_zero": {"model.residual_init_scale": 0.0},
    "xl_bias": {"model.xl_bias_init_std": 0.02},
    # The optimiser: warm-up, peak rate, clipping, Adam's beta2 and epsilon.
    "warmup_100": {"train.warmup_steps": 100},
    "warmup_800": {"train.warmup_steps": 800},
    "lr_half": {"train.lr": 5e-4},
    "lr_double": {"train.lr": 2e-3},
    "no_clip": {"train.grad_clip": None},
    "clip_1": {"train.grad_clip": 1.0},
    "beta2_0.98": {"train.adam_b2": 0.98},
    "beta2_0.95": {"train.adam_b2": 0.95},
    "eps_1e-6": {"train.adam_eps": 1e-6},
    # Regularisation and the XL memory.
    "attn_dropout": {"model.attn_dropout": 0.1},
    "dropout": {"model.dropout": 0.1},
    "no_memory": {"model.mem_len": 0},
    # The sigma-MoE authors' Transformer-XL as their code runs it (`paper_training`): Xavier
    # embedding, output dropout, LayerNorm eps 1e-5, learned attention scale, dropout 0.1;
    # Adam at 2.5e-4 with no warm-up (clipping 0.25 as here).
    "authors": {**_authors_model(), "model.dropout": 0.1, "train.lr": 2.5e-4,
                "train.warmup_steps": 0},
}


# The recipe the stalled runs trained, which the changes are made against: `quality_medium`
# with the token embedding N(0, 1), the library's default until the fix (issue 61).
STUDIED = {"model.embed_init": "normal"}


def recipe_overrides(recipe: str) -> dict:
  """The dotted overrides of a `+`-joined recipe; a ValueError names an unknown change or two
  changes that set one field differently."""
  overrides = {}
  for change in recipe.split("+"):
    if change not in CHANGES:
      raise ValueError(f"stall_medium.py: unknown change {change!r} in recipe {recipe!r}; "
                       f"changes: {tuple(CHANGES)}.")
    clash = {k for k, v in CHANGES[change].items() if overrides.get(k, v) != v}
    if clash:
      raise ValueError(f"stall_medium.py: recipe {recipe!r} sets {sorted(clash)} twice.")
    overrides.update(CHANGES[change])
  return overrides


def get_config(arg: str = "dense/baseline"):
  model, _, recipe = arg.partition("/")
  if model not in VARIANTS or not recipe:
    raise ValueError(f"stall_medium.py:MODEL/RECIPE needs MODEL one of {VARIANTS} and RECIPE "
                     f"one of {tuple(CHANGES)} or several joined by '+'; got {arg!r}.")
  config = quality_medium.get_config(model)
  config.train.update(steps=STEPS, schedule_steps=SCHEDULE_STEPS,
                      warmup_steps=SCHEDULE_STEPS // 10, eval_every=250, ckpt_every=250)
  config.eval.update(max_batches=20, copy_rows=16)  # The stall warning as in quality_medium:
  config.eval.copy_stall_window = SCHEDULE_STEPS // 10  # judged over the warm-up's length.
  return apply_recipe(config, recipe)


def apply_recipe(config, recipe: str):
  """`config` with the studied recipe (`STUDIED`) and `recipe`'s changes set (in place)."""
  config.update_from_flattened_dict({**STUDIED, **recipe_overrides(recipe)})
  return config
