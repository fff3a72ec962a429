"""Layers of sparse_jax. Feed-forward layers follow the contract `y, aux = layer(x)`."""

from sparse_jax.layers.counting import count_params
from sparse_jax.layers.dense_ff import DenseFF
from sparse_jax.layers.moe import MoE, SigmaMoE
from sparse_jax.layers.pkm import PKM
from sparse_jax.layers.registry import build_ff, ff_kinds, register_ff
from sparse_jax.layers.topk_ff import TopKFF
from sparse_jax.layers.xl_attention import RelativeMultiHeadAttention

__all__ = ["DenseFF", "MoE", "PKM", "RelativeMultiHeadAttention", "SigmaMoE", "TopKFF",
           "build_ff", "count_params", "ff_kinds", "register_ff"]
