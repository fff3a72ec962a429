"""Models of sparse_jax: the decoder LM, the RoBERTa-compatible encoder, the classifier and
Terraformer."""

from sparse_jax.models.classifier import SequenceClassifier
from sparse_jax.models.encoder import Encoder
from sparse_jax.models.lm import TransformerLM
from sparse_jax.models.lm_config import validate_model_config
from sparse_jax.models.terraformer import Terraformer
from sparse_jax.models.terraformer_config import TerraformerConfig
from sparse_jax.models.xl_memory import XLMemory

__all__ = ["Encoder", "SequenceClassifier", "Terraformer", "TerraformerConfig", "TransformerLM",
           "XLMemory", "validate_model_config"]
