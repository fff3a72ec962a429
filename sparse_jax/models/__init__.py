"""Models of sparse_jax."""

from sparse_jax.models.lm import TransformerLM, validate_model_config
from sparse_jax.models.xl_memory import XLMemory

__all__ = ["TransformerLM", "XLMemory", "validate_model_config"]
