"""sigma-MoE against its dense twin with the paper's expert shape, at the largest size this
2-core CPU trains in reasonable time.

Every sigma-MoE of the paper uses experts of G = 128 with K = 4 (Table 7); `quality_small`
uses 8 experts of 64 with K = 2. Here: 16 experts of 128, K = 4 (25% of the dense FF FLOPs),
the regulariser gamma = 0.001 of the WikiText-103 models and expert dropout 0.05 (WT-S*), on
a 4-layer, d_model 256 Transformer-XL with context 256 and as much memory, scaled down from
the paper's WT-S. `:dense` is the parameter-matched dense model (d_ff 2051).

    python -m benchmarks.quality_small --config=quality_medium --seeds=0,1,2 --corpora=builtin,prose
    sparse-jax train --config=quality_medium:dense
"""

from sparse_jax.configs import default, sigma_moe_paper
from sparse_jax.models.accounting import matched_dense_config

VARIANTS = ("sigma_moe", "dense")


def get_config(variant: str = "sigma_moe"):
  if variant not in VARIANTS:
    raise ValueError(f"quality_medium.py:<variant> must be one of {VARIANTS}; got {variant!r}.")
  config = default.get_config()
  config.data.seq_len = 256
  config.model.update(d_model=256, n_layers=4, n_heads=4, mem_len=256)
  config.model.ff = sigma_moe_paper.sigma_moe_ff(n_experts=16, expert_size=128, k=4,
                                                 expert_dropout=0.05, reg_coef=0.001)
  config.train.update(steps=4000, lr=1e-3, log_every=100, eval_every=500, ckpt_every=500)
  config.eval.max_batches = 100
  return matched_dense_config(config) if variant == "dense" else config
