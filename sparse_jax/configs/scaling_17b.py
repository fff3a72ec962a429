"""Scaling Transformers' 17B model as a decoder-only LM, split 8 ways over `mesh.tensor`.

    sparse-jax train --config=scaling_17b --compile_only=v5p:2x2x2
    sparse-jax train --config=scaling_17b:ff_qkv --compile_only=v5p:2x2x2

The shape of the paper's 17B model (Jaszczur et al. 2021, Table 1; `benchmarks/decode.py
--shape=17b`): d_model 9216, 96 heads, d_ff 49152, FF sparsity (block) 256, attention
sparsity S = 64. The paper's model is an encoder-decoder of 6 + 6 layers; this decoder-only
stand-in has 14 layers, which hold about the same parameters (17.4B with the dense FF).
Variants: `dense` (causal attention, dense FF) and `ff_qkv` (SparseFF and sparse QKV, `d_ff`
raised by `2 d_model` to 67584 for the parameters the sparse QKV layer frees, as
`benchmarks/decode.py` does). Sinusoidal positions at the input, as Trax's models; bfloat16
compute; the default's byte data (vocabulary 256). Every device of `tensor=8` holds 12 of the
96 heads (8 of the 64 modules) and an eighth of the FF's hidden units (33 of the sparse FF's
264 blocks). `benchmarks/tensor_parallel_fit.py` compiles its decoding step for TPUs.
"""

import ml_collections

from sparse_jax.configs import default

VARIANTS = ("dense", "ff_qkv")
D_MODEL, N_HEADS, D_FF, BLOCK_SIZE, ATTENTION_SPARSITY = 9216, 96, 49152, 256, 64
N_LAYERS = 14
TENSOR = 8


def get_config(variant: str | None = None) -> ml_collections.ConfigDict:
  variant = variant or "dense"
  if variant not in VARIANTS:
    raise ValueError(f"scaling_17b.py:<variant> must be one of {VARIANTS}; got {variant!r}.")
  config = default.get_config()
  config.model.update(d_model=D_MODEL, n_heads=N_HEADS, n_layers=N_LAYERS, attention="causal",
                      positions="sinusoidal", mem_len=0, dtype="bfloat16")
  config.model.ff = ml_collections.ConfigDict({"kind": "dense", "d_ff": D_FF})
  if variant == "ff_qkv":
    config.model.update(attention="sparse_qkv", attention_sparsity=ATTENTION_SPARSITY)
    config.model.ff = ml_collections.ConfigDict({
        "kind": "sparse_ff", "d_ff": D_FF + 2 * D_MODEL, "block_size": BLOCK_SIZE})
  config.mesh.update(data=-1, tensor=TENSOR)
  return config
