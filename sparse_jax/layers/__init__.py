"""Layers of sparse_jax. Feed-forward layers follow the contract `y, aux = layer(x)`."""

from sparse_jax.layers.adapters import BottleneckAdapter
from sparse_jax.layers.causal_attention import CausalSelfAttention
from sparse_jax.layers.counting import count_params
from sparse_jax.layers.dense_ff import DenseFF
from sparse_jax.layers.feed_forward import FeedForward
from sparse_jax.layers.fixed_base_positions import FixedBasePositions
from sparse_jax.layers.lsh_attention import LSHSelfAttention
from sparse_jax.layers.moe import MoE, SigmaMoE
from sparse_jax.layers.multiplicative_dense import MultiplicativeDense
from sparse_jax.layers.pkm import PKM
from sparse_jax.layers.registry import build_ff, ff_kinds, register_ff
from sparse_jax.layers.sparse_ff import SparseFF
from sparse_jax.layers.spartan import SpartanMemory
from sparse_jax.layers.sparse_qkv_attention import SparseQKVAttention
from sparse_jax.layers.sru import LowRankSRU
from sparse_jax.layers.switchhead_attention import SwitchHeadAttention, SwitchHeadXLAttention
from sparse_jax.layers.topk_ff import TopKFF
from sparse_jax.layers.xl_attention import RelativeMultiHeadAttention

__all__ = ["BottleneckAdapter", "CausalSelfAttention", "DenseFF", "FeedForward",
           "FixedBasePositions", "LSHSelfAttention", "LowRankSRU", "MoE", "MultiplicativeDense",
           "PKM",
           "RelativeMultiHeadAttention", "SigmaMoE", "SparseFF", "SparseQKVAttention",
           "SpartanMemory", "SwitchHeadAttention", "SwitchHeadXLAttention",
           "TopKFF", "build_ff", "count_params", "ff_kinds", "register_ff"]
