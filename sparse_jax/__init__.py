"""sparse_jax: sparse Transformers in JAX/Flax."""

from sparse_jax.decoding import generate

__all__ = ["generate"]
