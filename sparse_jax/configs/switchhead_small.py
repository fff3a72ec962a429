"""The SwitchHead paper's WikiText-103 small trio scaled down to a 2-core CPU: a dense
Transformer-XL with many heads, SwitchHead with a few, and a dense model with SwitchHead's head
count, at equal parameters (within 0.1%), on the embedded `builtin` data.

    python -m benchmarks.switchhead_small --seeds=0,1 --workdir=runs/switchhead_small
    sparse-jax train --config=switchhead_small:switchhead --print_params

`<variant>` is `dense` (10 heads of 20), `switchhead` (`model.attention="switchhead_xl"`, 2
heads of 37, E 5, K 2) or `dense_few` (2 heads of 100). The paper's `wt103_s` trio
(`sparse_jax/configs/switchhead_paper.py`: d_model 412, dense 10 x 41, SwitchHead 2 x 76 with E 5, K 2,
dense 2 x 205, d_ff about 5 d_model) with its ratios kept at d_model 200: the dense models'
H x Dh equals d_model (the paper's 410 ~ 412), SwitchHead's head is 0.185 d_model as the
paper's 76 / 412, and d_ff is 5 d_model for the dense models (the paper's 2053 / 412). As the
authors did, SwitchHead's FF is widened to the dense parameter count (its attention layer has
2.0% fewer parameters than dense's: +10 FF units). 4 layers, context 128 with 128 positions of
memory, batch 16, dense FF, no dropout, the sigma-MoE authors' Transformer-XL details
(`paper_training.authors_transformer_xl`; SwitchHead with its own fixed attention scale, as in
`sparse_jax/configs/switchhead_paper.py`), the default's Adam at 2e-3 with 10% warmup and cosine decay,
over 1200 steps (2.5M training bytes of `builtin`'s Python sources). d_model 200 and 1200
steps keep one run at about 10-20 minutes on the 2-core CPU VM (the 10-head dense model is the
slowest: many small heads). Validation: the first 100 segments, memory 512.
"""

import ml_collections

from sparse_jax.configs import default, paper_training

VARIANTS = ("dense", "switchhead", "dense_few")
D_MODEL = 200
D_FF = 5 * D_MODEL  # Both dense models'.
# variant: (heads, head size, E, K, d_ff); E and K None for the dense ones.
SHAPES = {
    "dense": (10, 20, None, None, D_FF),
    "switchhead": (2, 37, 5, 2, D_FF + 10),
    "dense_few": (2, 100, None, None, D_FF),
}


def get_config(variant: str = "switchhead") -> ml_collections.ConfigDict:
  if variant not in SHAPES:
    raise ValueError(f"switchhead_small.py:<variant> must be one of {VARIANTS}; "
                     f"got {variant!r}.")
  heads, head_dim, experts, k, d_ff = SHAPES[variant]
  config = default.get_config()  # builtin, batch 16, context 128, memory 128, 4 layers.
  config.model.update(d_model=D_MODEL, n_layers=4, n_heads=heads, head_dim=head_dim,
                      mem_len=128, dropout=0.0)
  config.model.ff = ml_collections.ConfigDict({"kind": "dense", "d_ff": d_ff})
  paper_training.authors_transformer_xl(config.model)
  if experts is not None:
    config.model.update(attention="switchhead_xl", attention_experts=experts, attention_k=k,
                        attn_scale="fixed")
  config.train.update(steps=1200, log_every=50, eval_every=600, ckpt_every=200)
  config.eval.max_batches = 100
  return config
