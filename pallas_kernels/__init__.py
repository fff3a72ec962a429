"""The grouped expert matmul of sigma-MoE (`cvmm`) and the MoE feed-forward built on one
layout (`expert_mlp`): Pallas Triton and Mosaic GPU kernels, XLA impls, the gather oracle;
the fused Transformer-XL attention (`xl_attention`)."""

from pallas_kernels.backends import IMPLS, partitionable, resolve
from pallas_kernels.cvmm import cvmm
from pallas_kernels.expert_mlp import expert_mlp
from pallas_kernels.xl_attention import xl_attention

__all__ = ["IMPLS", "cvmm", "expert_mlp", "partitionable", "resolve", "xl_attention"]
