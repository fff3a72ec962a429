"""A small dense LM and its Scaling Transformers counterparts, parameter-matched.

    sparse-jax train --config=scaling_small:dense
    sparse-jax train --config=scaling_small:ff_qkv_loss

Variants (Jaszczur et al. 2021, Table 1 and Sec. 3): `dense` (causal attention, dense FF),
`ff` (SparseFF, block 32), `qkv` (sparse QKV: multiplicative + convolution, S = heads),
`ff_qkv` (both) and `ff_qkv_loss` (both plus the multiplicative output layer, loss sparsity
4). Each sparse variant gets the largest `d_ff` that keeps the attention + FF parameters of a
block at most the dense block's, as the paper raises `d_ff` for sparse QKV. Every variant adds
a sinusoidal positional encoding at the input, as Trax's models do (`model.positions =
"sinusoidal"`: no rotary rotation in attention), and its SparseFF takes Trax's defaults
(clean soft mask, Glorot controller, no b1, mask before the ReLU).

A deliberate small-scale substitute for the paper's C4 encoder-decoders, whose sparse QKV is in
the decoder only (docs/scaling_transformers.md "Small models" says why and where that
placement is: the Terraformer's `model.decoder_qkv=sparse`).
"""

import ml_collections

from sparse_jax.configs import default
from sparse_jax.models.accounting import attention_params, ff_layer_stats, match_block_params

VARIANTS = ("dense", "ff", "qkv", "ff_qkv", "ff_qkv_loss")
BLOCK_SIZE = 32


def _dense_config() -> ml_collections.ConfigDict:
  config = default.get_config()
  config.model.update(attention="causal", positions="sinusoidal", n_heads=8, mem_len=0)
  config.model.ff = ml_collections.ConfigDict({"kind": "dense", "d_ff": 1024})
  return config


def get_config(variant: str = "dense") -> ml_collections.ConfigDict:
  if variant not in VARIANTS:
    raise ValueError(f"scaling_small.py:<variant> must be one of {VARIANTS}; got {variant!r}.")
  config = _dense_config()
  dense_block = attention_params(config.model) + ff_layer_stats(config.model)["params"]
  if "qkv" in variant:
    config.model.attention = "sparse_qkv"
  if variant.startswith("ff"):
    config.model.ff = ml_collections.ConfigDict({
        "kind": "sparse_ff", "d_ff": 1024, "block_size": BLOCK_SIZE, "d_lowrank": 32})
  if variant.endswith("loss"):
    config.model.loss_sparsity = 4
  if variant != "dense":
    config.model.ff.d_ff = match_block_params(config.model, dense_block, step=BLOCK_SIZE)
  return config
