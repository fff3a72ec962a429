"""`SequenceClassifier`: a backbone plus RoBERTa's classification head, for fine-tuning.

The backbone is an `Encoder` (`model.kind = "encoder"`: RoBERTa) or a `TransformerLM`
(`model.kind = "lm"`, the default: e.g. a byte LM pretrained with `train.py`); both take the
SPARTAN memory plug-in (`model.memory`), the encoder also adapters (`model.adapters`).
`logits_bc, aux = classifier(tokens_bt, lengths_b)`; `num_classes = 1` is regression (STS-B).

The head is RoBERTa's `RobertaClassificationHead` (no pooler): a pooled hidden state `x`,
`out_proj(Drop(tanh(dense(Drop(x)))))`. An encoder pools its first token (`<s>`), as RoBERTa
does. A causal LM has no such token: its last state is shaped by next-token prediction and
reflects mostly the last few tokens, so it pools the mean of its states over the `lengths`
real tokens instead.
"""

import jax
import jax.numpy as jnp
import ml_collections
from flax import nnx

from sparse_jax import validation
from sparse_jax.layers.bidirectional_attention import normal_linear
from sparse_jax.layers.param_types import HeadParam, retype_params
from sparse_jax.models.encoder import Encoder, EncoderConfig
from sparse_jax.models.lm import TransformerLM
from sparse_jax.models.lm_config import ModelConfig


def build_backbone(model_cfg: ml_collections.ConfigDict | ModelConfig, rngs: nnx.Rngs):
  """The `Encoder` or `TransformerLM` of the `model` section (by `model.kind`)."""
  cfg = ModelConfig.parse(model_cfg, "model")
  if isinstance(cfg, EncoderConfig):
    return Encoder(cfg, rngs=rngs)
  return TransformerLM(cfg, rngs=rngs)


class ClassificationHead(nnx.Module):
  """RoBERTa's head on pooled states `[B, d]` -> logits `[B, C]` (module docstring)."""

  def __init__(self, d_model: int, num_classes: int, *, dropout: float, rngs: nnx.Rngs):
    self.dense = retype_params(normal_linear(d_model, d_model, 0.02, rngs,
                                             axes=("embed", "mlp")), HeadParam)
    self.out_proj = retype_params(normal_linear(d_model, num_classes, 0.02, rngs,
                                                axes=("mlp", "classes")), HeadParam)
    self.dropout = nnx.Dropout(dropout, rngs=rngs)

  def __call__(self, x_bd: jax.Array) -> jax.Array:
    h_bd = jnp.tanh(self.dense(self.dropout(x_bd)))
    return self.out_proj(self.dropout(h_bd))


class SequenceClassifier(nnx.Module):
  """Backbone (`self.backbone`) and task head (`self.head`); see the module docstring."""

  def __init__(self, model_cfg: ml_collections.ConfigDict | ModelConfig, num_classes: int, *,
               head_dropout: float = 0.1, rngs: nnx.Rngs):
    validation.require_positive_int(num_classes, "num_classes")
    validation.require_probability(head_dropout, "method.head_dropout")
    cfg = ModelConfig.parse(model_cfg, "model")
    self.pool_first = isinstance(cfg, EncoderConfig)
    self.backbone = build_backbone(cfg, rngs)
    self.dtype = self.backbone.dtype  # The compute dtype (`model.dtype` or `backbone.dtype`).
    self.head = ClassificationHead(cfg.d_model, num_classes, dropout=head_dropout, rngs=rngs)

  def __call__(self, tokens_bt: jax.Array, lengths_b: jax.Array):
    if self.pool_first:
      h_btd, aux = self.backbone(tokens_bt)
      pooled_bd = h_btd[:, 0]
    else:
      h_btd, _, aux = self.backbone.hidden_states(tokens_bt)
      real_bt = jnp.arange(tokens_bt.shape[1])[None, :] < lengths_b[:, None]
      pooled_bd = (jnp.einsum("btd,bt->bd", h_btd.astype(jnp.float32), real_bt)
                   / jnp.maximum(lengths_b, 1)[:, None])
    return self.head(pooled_bd.astype(jnp.float32)), aux
