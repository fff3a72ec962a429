"""`Encoder`: a post-LN bidirectional Transformer with RoBERTa's architecture.

    h_0 = LN(E_word[x] + E_pos[p(x)] + E_type[0])                     (dropout after)
    a   = Drop(Attn(h))
    h   = LN(h + a)           (Houlsby: an adapter on a, `layers.adapters.adapted_residual`)
    f   = Drop(FF(h))
    h   = LN(h + f)           (Houlsby and Pfeiffer: an adapter on f)
    h   = SPARTAN(h)          (when model.memory.kind = "spartan")

`p(x)` are RoBERTa's positions: real tokens count from `pad_id + 1`, padding gets `pad_id`
(Hugging Face's `create_position_ids_from_input_ids`), so a table of `max_positions` rows
holds `max_positions - pad_id - 1` tokens. The FF slot is any kind of the FF registry (RoBERTa:
`dense` with `activation = "gelu"`); adapters and memory are the plug-ins of
`sparse_jax.models.plugins`. `h, aux = encoder(tokens_bt)`; `aux["reg_loss"]` sums the FF
layers' regularisers and `aux["layer{i}/..."]` holds their diagnostics.
"""


import jax
import jax.numpy as jnp
import ml_collections
from flax import nnx

from sparse_jax import schema, validation
from sparse_jax.layers.adapters import adapted_residual
from sparse_jax.layers.bidirectional_attention import BidirectionalSelfAttention
from sparse_jax.layers.normalization import layer_norm
from sparse_jax.layers.precision import COMPUTE_DTYPES
from sparse_jax.layers.registry import build_ff
from sparse_jax.models import plugins
from sparse_jax.models.lm_config import ModelConfig
from sparse_jax.models.remat import rematerialized


@ModelConfig.variant("encoder")
class EncoderConfig(ModelConfig):
  """The `model` section of an encoder (`model.kind = "encoder"`): RoBERTa's fields on top of
  those every model has (`hf_roberta.encoder_config` reads them from a `config.json`)."""

  max_positions: schema.PositiveInt  # Rows of the position table (module docstring).
  type_vocab_size: schema.PositiveInt
  pad_id: schema.NonNegativeInt
  layer_norm_eps: schema.PositiveFloat
  init_std: schema.PositiveFloat

  def check(self, path: str) -> None:
    super().check(path)
    validation.require(self.d_model % self.n_heads == 0, f"{path}.d_model",
                       f"divisible by {path}.n_heads={self.n_heads}", self.d_model)
    validation.require(self.pad_id < self.vocab_size, f"{path}.pad_id",
                       f"a token id in [0, {path}.vocab_size={self.vocab_size})", self.pad_id)
    validation.require(self.max_positions > self.pad_id + 1, f"{path}.max_positions",
                       f"greater than {path}.pad_id + 1 = {self.pad_id + 1}",
                       self.max_positions)


def roberta_positions(tokens_bt: jax.Array, pad_id: int) -> jax.Array:
  """RoBERTa's position ids: `pad_id + 1 + (index among real tokens)`, `pad_id` on padding."""
  real_bt = (tokens_bt != pad_id).astype(jnp.int32)
  return jnp.cumsum(real_bt, axis=1) * real_bt + pad_id


def _embedding(n: int, d: int, std: float, rngs: nnx.Rngs) -> nnx.Embed:
  return nnx.Embed(n, d, embedding_init=jax.nn.initializers.normal(std),
                   embedding_metadata={"logical_axes": ("vocab", "embed")}, rngs=rngs)


class EncoderLayer(nnx.Module):
  """One post-LN layer with its optional adapters and SPARTAN memory (module docstring)."""

  def __init__(self, cfg: EncoderConfig, *, rngs: nnx.Rngs):
    d, eps = cfg.d_model, cfg.layer_norm_eps
    self.attn = BidirectionalSelfAttention(d, cfg.n_heads, attn_dropout=cfg.attn_dropout,
                                           init_std=cfg.init_std, rngs=rngs)
    self.attn_adapter = plugins.build_adapter(cfg.adapters, d, "attn", rngs)
    self.attn_norm = layer_norm(d, epsilon=eps, rngs=rngs)
    self.ff = build_ff(cfg.ff, d_model=d, n_layers=cfg.n_layers, rngs=rngs)
    self.ff_adapter = plugins.build_adapter(cfg.adapters, d, "ff", rngs)
    self.ff_norm = layer_norm(d, epsilon=eps, rngs=rngs)
    self.memory = plugins.build_memory(cfg.memory, d, rngs)
    self.dropout = nnx.Dropout(cfg.dropout, rngs=rngs)

  def __call__(self, h_btd: jax.Array, valid_bt: jax.Array):
    a_btd = self.dropout(self.attn(h_btd, valid_bt))
    h_btd = adapted_residual(self.attn_adapter, a_btd, h_btd, self.attn_norm)
    f_btd, aux = self.ff(h_btd)
    h_btd = adapted_residual(self.ff_adapter, self.dropout(f_btd), h_btd, self.ff_norm)
    return plugins.apply_memory(self.memory, h_btd, aux)


def _call_layer(layer: EncoderLayer, h_btd, valid_bt):
  return layer(h_btd, valid_bt)


class Encoder(nnx.Module):
  """RoBERTa-compatible encoder: `h_btd, aux = encoder(tokens_bt)` (module docstring).

  Padding (`tokens == pad_id`) is masked out of attention. Random init as BERT's: weights
  `N(0, init_std^2)` (0.02), zero biases, unit LayerNorm scales.
  """

  def __init__(self, cfg: ml_collections.ConfigDict | dict | EncoderConfig, *, rngs: nnx.Rngs):
    cfg = EncoderConfig.parse(cfg, "model")
    self.pad_id, self.d_model = cfg.pad_id, cfg.d_model
    self.dtype = COMPUTE_DTYPES[cfg.dtype]
    self.remat = cfg.remat
    std = cfg.init_std
    self.word_embeddings = _embedding(cfg.vocab_size, cfg.d_model, std, rngs)
    self.position_embeddings = _embedding(cfg.max_positions, cfg.d_model, std, rngs)
    self.type_embeddings = _embedding(cfg.type_vocab_size, cfg.d_model, std, rngs)
    self.embed_norm = layer_norm(cfg.d_model, epsilon=cfg.layer_norm_eps, rngs=rngs)
    self.embed_dropout = nnx.Dropout(cfg.dropout, rngs=rngs)
    self.layers = nnx.List([EncoderLayer(cfg, rngs=rngs) for _ in range(cfg.n_layers)])

  def embed(self, tokens_bt: jax.Array) -> jax.Array:
    positions_bt = roberta_positions(tokens_bt, self.pad_id)
    h_btd = (self.word_embeddings(tokens_bt) + self.position_embeddings(positions_bt)
             + self.type_embeddings(jnp.zeros_like(tokens_bt)))
    return self.embed_dropout(self.embed_norm(h_btd).astype(self.dtype))

  def __call__(self, tokens_bt: jax.Array) -> tuple[jax.Array, dict[str, jax.Array]]:
    valid_bt = tokens_bt != self.pad_id
    h_btd = self.embed(tokens_bt)
    reg_loss, aux = jnp.zeros((), jnp.float32), {}
    call = rematerialized(_call_layer, self.remat)
    for i, layer in enumerate(self.layers):
      h_btd, layer_aux = call(layer, h_btd, valid_bt)
      reg_loss = reg_loss + layer_aux.pop("reg_loss", 0.0)
      aux.update({f"layer{i}/{k}": v for k, v in layer_aux.items()})
    return h_btd, {"reg_loss": reg_loss, **aux}


def roberta_base_config() -> ml_collections.ConfigDict:
  """The `model` section of RoBERTa-base (125M parameters), no plug-ins."""
  return ml_collections.ConfigDict({
      "kind": "encoder", "vocab_size": 50265, "d_model": 768, "n_layers": 12, "n_heads": 12,
      "max_positions": 514, "type_vocab_size": 1, "pad_id": 1, "layer_norm_eps": 1e-5,
      "dropout": 0.1, "attn_dropout": 0.1, "init_std": 0.02,
      "ff": {"kind": "dense", "d_ff": 3072, "activation": "gelu", "dropout": 0.0},
      "memory": {"kind": "none"}, "adapters": {"kind": "none"},
  })
