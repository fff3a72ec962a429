"""MoEUT against its parameter-matched dense baseline at small scale on a 2-core CPU, on the
embedded `builtin` data (`benchmarks/switchhead_small.py`'s `moeut` comparison).

    python -m benchmarks.switchhead_small --variants=moeut_dense,moeut
    sparse-jax train --config=moeut_small:moeut --print_params

`<variant>`: `moeut_dense`, the authors' dense baseline shape (pre-LN, RoPE on half of each
head's channels) at d_model 200: 4 layers, 10 heads of 20, d_ff 975 (as the authors tuned
theirs, to the MoEUT's parameter count); `moeut`: 2 shared blocks repeated to 4 layers (ABAB),
SwitchHead with RoPE (4 heads of 40, E 8, K 2: the 44M model's 4 x 82 at d_model 412 scaled), a
sigma-MoE FF of 10 experts of 128 (K 4), peri-LayerNorm, gamma 0.01 and delta 0.001
(`sparse_jax/configs/moeut_paper.py`). Both: context 128 without memory (MoEUT has none), dropout 0,
their code's embedding init and LayerNorm epsilon, AdamW at 2e-3 with weight decay 0.01, 10%
warmup, cosine decay to 0.1 lr, 1200 steps, as `sparse_jax/configs/switchhead_small.py`'s runs.
"""

import ml_collections

from sparse_jax.configs import default, moeut_paper

VARIANTS = ("moeut_dense", "moeut")
D_MODEL = 200
FF_EXPERTS = 10
DENSE_D_FF = 975  # 4.9 d_model: the two within 0.1% (tests/test_switchhead_small_smoke.py).


def get_config(variant: str = "moeut") -> ml_collections.ConfigDict:
  if variant not in VARIANTS:
    raise ValueError(f"moeut_small.py:<variant> must be one of {VARIANTS}; got {variant!r}.")
  config = default.get_config()  # builtin, batch 16, context 128, 4 layers.
  config.model.update(d_model=D_MODEL, n_layers=4, mem_len=0, dropout=0.0,
                      positions="rotary", rotary_fraction=0.5, embed_init="fan_in",
                      layer_norm_eps=1e-5)
  if variant == "moeut_dense":
    config.model.update(attention="causal", n_heads=10, head_dim=20)
    config.model.ff = ml_collections.ConfigDict({"kind": "dense", "d_ff": DENSE_D_FF})
  else:
    config.model.update(attention="switchhead", n_heads=4, head_dim=40, attention_experts=8,
                        attention_k=2, layer_groups=2, block_norm="peri", moeut_ff_reg=0.01,
                        moeut_attention_reg=0.001)
    config.model.ff = ml_collections.ConfigDict(moeut_paper.sigma_moe_ff(FF_EXPERTS, 4))
  config.eval.mem_len = 0
  config.train.update(optimizer="adamw", weight_decay=0.01, end_lr_fraction=0.1, steps=1200,
                      log_every=50, eval_every=600, ckpt_every=200)
  config.eval.max_batches = 100
  return config
