"""WikiText-103 big dense baseline ("WT-B") of the sigma-MoE paper (Table 6, 262M parameters).

The data of `sparse_jax/configs/wt103_s_dense.py` (SentencePiece 8k) with a bigger model, a longer
context and 4000 warmup steps (4% of `train.steps`, so it follows an override of the steps).
`sparse-jax train --config=wt103_b_dense --config.data.data_dir=DIR` after
preparing the data (docs/datasets.md).
"""

import ml_collections

from sparse_jax.configs import wt103_s_dense


def get_config() -> ml_collections.ConfigDict:
  config = wt103_s_dense.on_wikitext103(context=512, d_model=1024, n_layers=18, n_heads=16,
                                        head_dim=64, dropout=0.2, d_ff=4110)
  config.train.warmup_steps = config.train.get_ref("steps") // 25  # 4000 of the 100k steps.
  return config
