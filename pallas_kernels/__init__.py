"""Pallas GPU kernels for sparse_jax: `cvmm`, the grouped expert matmul of sigma-MoE."""

from pallas_kernels.cvmm import IMPLS, cvmm

__all__ = ["IMPLS", "cvmm"]
