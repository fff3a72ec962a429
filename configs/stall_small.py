"""The `quality_medium` stall, reproduced small enough to train many seeds (issue 61).

3 of the 12 `quality_medium` runs stalled after the warm-up's peak with a weak or missing copy
mechanism (benchmarks/history/2026-11-28_quality_medium.md). This is its dense model shrunk
to d_model 128, 2 layers (the fewest that can form induction heads), context and memory of
128 and 1000 steps (the warm-up still 10%): about 4 minutes per run on this repository's 2-core
CPU. Each variant changes one thing against `baseline` (`VARIANTS`, dotted config fields);
`benchmarks/stall_sweep.py` trains them over seeds and counts the stalls.

    python -m benchmarks.stall_sweep --variants=baseline,xavier --seeds=0-11
    python train.py --config=configs/stall_small.py:xavier --config.seed=3
"""

import ml_collections

from configs import paper_training, quality_medium


def _authors_model() -> dict:
  """`paper_training.authors_transformer_xl`'s fields as dotted overrides."""
  model = ml_collections.ConfigDict()
  paper_training.authors_transformer_xl(model)
  return {f"model.{name}": value for name, value in model.items()}


VARIANTS = {
    "baseline": {},
    # The token embedding's scale: N(0, 1) in the baseline.
    "xavier": {"model.embed_init": "xavier"},
    "fan_in": {"model.embed_init": "fan_in"},
    # The optimiser: a lower peak, a longer warm-up, no clipping.
    "lr_half": {"train.lr": 5e-4},
    "warmup_300": {"train.warmup_steps": 300},
    "no_clip": {"train.grad_clip": None},
    # Regularisation and the XL memory.
    "attn_dropout": {"model.attn_dropout": 0.1},
    "dropout": {"model.dropout": 0.1},
    "no_memory": {"model.mem_len": 0},
    # The sigma-MoE authors' LM details (Xavier embedding, output dropout, LayerNorm eps 1e-5,
    # learned attention scale: `paper_training.authors_transformer_xl`) with their dropout.
    "authors_model": {**_authors_model(), "model.dropout": 0.1},
}


def get_config(variant: str = "baseline"):
  if variant not in VARIANTS:
    raise ValueError(f"stall_small.py:<variant> must be one of {tuple(VARIANTS)}; "
                     f"got {variant!r}.")
  config = quality_medium.get_config("dense")
  config.data.seq_len = 128
  config.model.update(d_model=128, n_layers=2, mem_len=128)
  config.model.ff = {"kind": "dense", "d_ff": 512}
  config.train.update(steps=1000, log_every=50, eval_every=250, ckpt_every=250)
  config.eval.update(max_batches=20, copy_rows=32)
  config.update_from_flattened_dict(VARIANTS[variant])
  return config
