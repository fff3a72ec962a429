"""sparse_jax: sparse Transformers in JAX/Flax."""
