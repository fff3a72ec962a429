"""The SwitchHead paper's models (Csordas et al. 2024, Tables 2-3): per dataset three Transformer-XL
LMs with the same number of parameters, a dense model with many heads, SwitchHead with a few,
and a dense model with SwitchHead's head count.

    sparse-jax train --config=switchhead_paper:wt103_s,switchhead
    sparse-jax train --config=switchhead_paper:e8,dense_few --print_params

`<model>` is `wt103_s` (47M), `wt103_b` (262M), `c4_b` (262M) or `e8` (41M); `<variant>`
`dense` (the paper's baseline, this repo's dense config of the same model), `switchhead` (V
and O experts, `model.attention="switchhead_xl"`) or `dense_few`. Shapes from the authors'
sweeps (RobertCsordas/moe_attention `sweeps/`: `wikitext103_moeatt_matched_l_ff`,
`wikitext103_moeatt_big_h2_matched_k4`, `c4_moeatt_big_h4_matched`, `enwik8_moeatt` and their
baselines): they tuned SwitchHead's head size and FF width to the dense parameter count, and
keep H x Dh of the two dense models equal (410 for the small one, not d_model 412).

Each builds on the sigma-MoE paper's dense config of its size (`sparse_jax/configs/wt103_s_dense.py`,
`wt103_b_dense.py`, `e8_dense.py`: data, context and memory, dropout, Adam at 2.5e-4 with
cosine decay over 100k steps, clipping, warmup; the authors' Transformer-XL details). SwitchHead
uses its own fixed attention scale (no learned scale, no u/v biases). C4 is not a dataset here:
`c4_b` is the C4 model on the user's text (`text_files` with SentencePiece 8k, set
`--config.data.file=...`; 0.5% each for validation and test), the WT-103 big training otherwise.
"""

import ml_collections

from sparse_jax.configs import e8_dense, wt103_b_dense, wt103_s_dense

VARIANTS = ("dense", "switchhead", "dense_few")
# model: (base config, dense heads x head size, SwitchHead heads x head size, E, K, its d_ff,
#         the few-head dense model's heads x head size); dense d_ff is the base config's.
MODELS = {
    "wt103_s": (wt103_s_dense, (10, 41), (2, 76, 5, 2, 2080), (2, 205)),
    "wt103_b": (wt103_b_dense, (16, 64), (2, 132, 8, 4, 4147), (2, 512)),
    "c4_b": (wt103_b_dense, (16, 64), (4, 112, 4, 2, 4188), (4, 256)),
    "e8": (e8_dense, (8, 64), (2, 112, 4, 2, 2088), (2, 256)),
}


def get_config(spec: str = "wt103_s,switchhead") -> ml_collections.ConfigDict:
  model, _, variant = spec.partition(",")
  if model not in MODELS or variant not in VARIANTS:
    raise ValueError(f"switchhead_paper.py:<model>,<variant> needs a model in {sorted(MODELS)} "
                     f"and a variant in {VARIANTS}; got {spec!r}.")
  base, dense, (heads, head_dim, experts, k, d_ff), few = MODELS[model]
  config = base.get_config()
  if model == "c4_b":
    config.data = ml_collections.ConfigDict({
        "name": "text_files", "tokenizer": "sentencepiece", "sp_vocab_size": 8000,
        "file": ml_collections.FieldReference(None, field_type=str),
        "split_fractions": (0.99, 0.005, 0.005),  # C4's validation share in their sweeps
        "batch_size": config.data.batch_size, "seq_len": config.data.seq_len})
  if variant == "switchhead":
    config.model.update(attention="switchhead_xl", n_heads=heads, head_dim=head_dim,
                        attention_experts=experts, attention_k=k, attn_scale="fixed")
    config.model.ff.d_ff = d_ff
  else:
    config.model.n_heads, config.model.head_dim = dense if variant == "dense" else few
  return config
