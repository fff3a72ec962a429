"""The dense baselines of the paper (Table 6), including WT-S* (d_ff 16480, 238M).

    sparse-jax train --config=dense_paper:wt103_s_star

`wt103_s`, `wt103_b` and `e8` are `sparse_jax/configs/wt103_s_dense.py`, `sparse_jax/configs/wt103_b_dense.py` and
`sparse_jax/configs/e8_dense.py`; this file also names them, so every paper model has one spelling.
"""

import ml_collections

from sparse_jax.configs import e8_dense, wt103_b_dense, wt103_s_dense

MODELS = {
    "wt103_s": (wt103_s_dense, 2053),
    "wt103_s_star": (wt103_s_dense, 16480),
    "wt103_b": (wt103_b_dense, 4110),
    "e8": (e8_dense, 2053),
}


def get_config(model: str = "wt103_s") -> ml_collections.ConfigDict:
  if model not in MODELS:
    raise ValueError(f"dense_paper.py:<model> must be one of {sorted(MODELS)}; got {model!r}.")
  dense_module, d_ff = MODELS[model]
  config = dense_module.get_config()
  config.model.ff.d_ff = d_ff
  return config
