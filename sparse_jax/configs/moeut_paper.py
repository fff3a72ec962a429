"""MoEUT (Csordas et al. 2024, "MoEUT: Mixture-of-Experts Universal Transformers"): its 44M and
244M models, their parameter-matched dense baselines, and the sigma-MoE control without
layer sharing.

    sparse-jax train --config=moeut_paper:44m,moeut --config.data.file=TEXT
    sparse-jax train --config=moeut_paper:244m,dense --print_params

`<size>` is `44m` or `244m`; `<variant>`:
- `moeut`: G = 2 distinct layers repeated in order (ABAB...) to 16 or 18, each SwitchHead
  attention with RoPE (4 heads, V and O experts, K 2) and a sigma-MoE FF of experts of 128
  (155 experts K 12, or 387 experts K 16), peri-LayerNorm, the per-sequence entropy
  regulariser over time and repeats (gamma 0.01 FF, delta 0.001 attention), dropout 0.
  From the authors' sweeps (RobertCsordas/moeut_training_code
  `c4_moeut_small_matched_rope_noln_long`, `c4_moeut_big_matched_rope_noln`).
- `dense`: their pre-LN RoPE Transformer baseline (`c4_baseline_small_rope_long_nodrop`,
  `c4_baseline_big_rope_nodrop`): 10 x 41 heads and d_ff 2053, or 16 x 64 and 4110; RoPE on
  half of each head's channels, as their `FastRopeAttention`.
- `sigma_moe`: the control without sharing (G = n_layers) at the same parameters. Theirs has
  SwitchHead with one expert per head (a dense V and a sigmoid-gated O per head) and 17 FF
  experts (44M; 40 at 244M); SwitchHead here needs E >= 2, so the control's attention is
  dense causal RoPE attention of the same heads (pre-LayerNorm, as peri-LayerNorm needs
  SwitchHead's raw values), with the FF experts that bring it to the MoEUT's parameters.

Training as theirs: context 1024 without memory, batch 64, 100k steps, AdamW (lr 2.5e-4,
weight decay 0.01) with cosine decay to 0.1 lr, clipping 0.1 (44M) or 0.25 with 4000 warmup
steps (244M), SentencePiece 8000; their code's token embedding init (N(0, 1 / d_model)) and
LayerNorm epsilon (1e-5). C4 is not a dataset here: the models train on your text
(`text_files`, `--config.data.file=...`, 0.5% each for validation and test).
"""

import ml_collections

VARIANTS = ("moeut", "dense", "sigma_moe")
# size: d_model, n_layers, (SwitchHead heads, head_dim, E), (FF experts, K), dense (heads,
# head_dim, d_ff), the control's FF experts, clip, warmup.
SIZES = {
    "44m": (412, 16, (4, 82, 8), (155, 12), (10, 41, 2053), 17, 0.1, 0),
    "244m": (1024, 18, (4, 128, 10), (387, 16), (16, 64, 4110), 40, 0.25, 4000),
}


def sigma_moe_ff(n_experts: int, k: int) -> dict:
  """MoEUT's FF: sigmoid top-K over experts of 128, no Eq. 20 regulariser (its own is the
  model's `moeut_ff_reg`), no expert dropout."""
  return {"kind": "sigma_moe", "n_experts": n_experts, "expert_size": 128, "k": k,
          "reg_coef": 0.0, "expert_dropout": 0.0}


def get_config(spec: str = "44m,moeut") -> ml_collections.ConfigDict:
  size, _, variant = spec.partition(",")
  if size not in SIZES or variant not in VARIANTS:
    raise ValueError(f"moeut_paper.py:<size>,<variant> needs a size in {sorted(SIZES)} and a "
                     f"variant in {VARIANTS}; got {spec!r}.")
  d, layers, (heads, head_dim, att_e), (ff_e, ff_k), dense, control_e, clip, warmup = SIZES[size]
  config = ml_collections.ConfigDict()
  config.seed = 0
  config.data = ml_collections.ConfigDict({
      "name": "text_files", "tokenizer": "sentencepiece", "sp_vocab_size": 8000,
      "file": ml_collections.FieldReference(None, field_type=str),
      "split_fractions": (0.99, 0.005, 0.005), "batch_size": 64, "seq_len": 1024})
  config.model = ml_collections.ConfigDict({
      "vocab_size": config.data.get_ref("sp_vocab_size").identity(), "d_model": d,
      "n_layers": layers, "mem_len": 0, "dropout": 0.0, "positions": "rotary",
      "rotary_fraction": 0.5,  # Theirs rotate half of each head, dense and SwitchHead alike.
      "embed_init": "fan_in", "layer_norm_eps": 1e-5})  # Their code's (moeut/moeut.py).
  if variant == "dense":
    config.model.update(attention="causal", n_heads=dense[0], head_dim=dense[1],
                        ff={"kind": "dense", "d_ff": dense[2], "dropout": 0.0})
  elif variant == "moeut":
    config.model.update(attention="switchhead", n_heads=heads, head_dim=head_dim,
                        attention_experts=att_e, attention_k=2, layer_groups=2,
                        block_norm="peri", moeut_ff_reg=0.01, moeut_attention_reg=0.001,
                        ff=sigma_moe_ff(ff_e, ff_k))
  else:
    config.model.update(attention="causal", n_heads=heads, head_dim=head_dim,
                        moeut_ff_reg=0.01, ff=sigma_moe_ff(control_e, ff_k))
  config.train = ml_collections.ConfigDict({
      "steps": 100_000, "lr": 2.5e-4, "optimizer": "adamw", "weight_decay": 0.01,
      "end_lr_fraction": 0.1, "grad_clip": clip, "warmup_steps": warmup, "log_every": 100,
      "eval_every": 10_000, "ckpt_every": 1000})
  config.eval = ml_collections.ConfigDict({"batch_size": 4, "mem_len": 0})
  config.mesh = ml_collections.ConfigDict({"data": -1})
  return config
