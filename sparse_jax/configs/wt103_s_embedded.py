"""The sigma-MoE paper's WT-103 S comparison, dense (Table 6) against sigma-MoE (Table 7), on the
embedded corpora instead of WikiText-103: issue 60's comparison for one GPU call.

The two models are `sparse_jax/configs/wt103_s_dense.py` and `sparse_jax/configs/sigma_moe_paper.py:wt103_s` as they
are (16 layers, d_model 412, batch 64 x 256, the paper's Adam at 2.5e-4 without warmup, each
its own gradient clipping) in bfloat16 compute, reading bytes (vocabulary 256, no
SentencePiece model to train) of `builtin` or, through `benchmarks.quality_small --corpora`,
`prose`, for `STEPS` steps with the cosine decay ending there (about one pass over `builtin`'s
28 MB train split); evaluated as the paper does, on 4 streams with 4x the context as memory,
over 100 batches. On an H200 (2026-11-28) a step took 86 ms dense and 73 ms sigma-MoE: both
runs fit one 10-minute GPU call.

    python -m benchmarks.quality_small --config=wt103_s_embedded --corpora=builtin --jobs=2
    sparse-jax train --config=wt103_s_embedded:dense
"""

import ml_collections

from sparse_jax.configs import default, sigma_moe_paper, wt103_s_dense

VARIANTS = ("sigma_moe", "dense")
STEPS = 2000


def get_config(variant: str = "sigma_moe") -> ml_collections.ConfigDict:
  if variant not in VARIANTS:
    raise ValueError(f"wt103_s_embedded.py:<variant> must be one of {VARIANTS}; "
                     f"got {variant!r}.")
  paper = (sigma_moe_paper.get_config("wt103_s") if variant == "sigma_moe"
           else wt103_s_dense.get_config())
  config = default.get_config()  # The embedded data and where it evaluates.
  config.data.update(batch_size=paper.data.batch_size, seq_len=paper.data.seq_len)
  config.model = paper.model
  config.model.update(vocab_size=256, dtype="bfloat16")
  config.train = paper.train
  config.train.update(steps=STEPS, log_every=100, eval_every=STEPS, ckpt_every=500)
  config.eval.update(batch_size=paper.eval.batch_size, max_batches=100)
  return config
