"""`quality_medium`'s first 1000 steps: the shortest run that tells a stalled seed (issue 61).

3 of the 12 `quality_medium` runs stalled just after the warm-up's peak and never caught up,
each with a weak or missing copy mechanism (benchmarks/history/2026-11-28_quality_medium.md).
They part from the others at steps 600-1000, and at step 1000 the training's stall rule
(`sparse_jax.tasks.copy_score.StallRule`) tells them apart: so this trains the same runs, on the
same 4000-step schedule, for their first 1000 steps (a quarter of the time), evaluating every
250 steps on 20 batches. Smaller models do not learn to copy by step 1000 at all, stalled or
not (benchmarks/history/2026-11-28_stall.md), so they cannot tell a stall.

The argument is `MODEL/CHANGE`: `MODEL` one of `quality_medium.VARIANTS` ("dense",
"sigma_moe"), `CHANGE` one of `CHANGES`, each one thing changed against the recipe the
stalled runs trained ("baseline": `quality_medium` with the N(0, 1) token embedding that was
the default until the fix, `STUDIED`). `benchmarks/stall_sweep.py` trains them over seeds and
counts the stalls.

    python -m benchmarks.stall_sweep --models=dense,sigma_moe --changes=baseline,fan_in --seeds=0-5
    sparse-jax train --config=stall_medium:dense/fan_in --config.seed=1
"""

import ml_collections

from sparse_jax.configs import paper_training, quality_medium

VARIANTS = quality_medium.VARIANTS
STEPS = 1000
SCHEDULE_STEPS = 4000  # quality_medium's: its warm-up (10%) and cosine decay.


def _authors_model() -> dict:
  """`paper_training.authors_transformer_xl`'s fields as dotted overrides."""
  model = ml_collections.ConfigDict()
  paper_training.authors_transformer_xl(model)
  return {f"model.{name}": value for name, value in model.items()}


CHANGES = {
    "baseline": {},
    # The token embedding's scale. N(0, 1) in the recipe studied; "fan_in" (the fix, now the
    # default) is the same draw scaled by 1/sqrt(d_model): nothing else about the run changes.
    "fan_in": {"model.embed_init": "fan_in"},
    "xavier": {"model.embed_init": "xavier"},
    # The optimiser: half the peak, twice the warm-up, no clipping.
    "lr_half": {"train.lr": 5e-4},
    "warmup_800": {"train.warmup_steps": 800},
    "no_clip": {"train.grad_clip": None},
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


def get_config(arg: str = "dense/baseline"):
  model, _, change = arg.partition("/")
  if model not in quality_medium.VARIANTS or change not in CHANGES:
    raise ValueError(f"stall_medium.py:MODEL/CHANGE needs MODEL one of "
                     f"{quality_medium.VARIANTS} and CHANGE one of {tuple(CHANGES)}; got {arg!r}.")
  config = quality_medium.get_config(model)
  config.train.update(steps=STEPS, schedule_steps=SCHEDULE_STEPS,
                      warmup_steps=SCHEDULE_STEPS // 10, eval_every=250, ckpt_every=250)
  config.eval.update(max_batches=20, copy_rows=16)  # The stall warning as in quality_medium:
  config.eval.copy_stall_window = SCHEDULE_STEPS // 10  # judged over the warm-up's length.
  config.update_from_flattened_dict({**STUDIED, **CHANGES[change]})
  return config
