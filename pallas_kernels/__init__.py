"""Pallas GPU kernels for sparse_jax."""
