"""`TransformerLM`: a pre-LN decoder with Transformer-XL relative attention and memory.

Every block is `h + Drop(Attn(LN([mem; h])))` then `h + Drop(FF(LN(h)))`, the FF taken from the
feed-forward registry by `model.ff.kind`. Each layer's memory is the stop-gradient of its input
from previous segments (Dai et al. 2019), so context carries across segments of a stream.
"""

import math

import jax
import jax.numpy as jnp
import ml_collections
from flax import nnx

from sparse_jax import validation
from sparse_jax.layers import initializers
from sparse_jax.layers.registry import build_ff
from sparse_jax.layers.xl_attention import RelativeMultiHeadAttention
from sparse_jax.models.xl_memory import XLMemory

DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}


def head_dim_of(cfg: ml_collections.ConfigDict) -> int:
  """`model.head_dim`, defaulting to `d_model // n_heads`."""
  return cfg.get("head_dim") or cfg.d_model // cfg.n_heads


def validate_model_config(cfg: ml_collections.ConfigDict) -> None:
  """Checks the `model` section; the FF fields are checked by their registry builder."""
  for name in ("vocab_size", "d_model", "n_layers", "n_heads"):
    validation.require_positive_int(cfg.get(name), f"model.{name}")
  if cfg.get("head_dim"):
    validation.require_positive_int(cfg.head_dim, "model.head_dim")
  else:
    validation.require(cfg.d_model % cfg.n_heads == 0, "model.d_model",
                       f"divisible by model.n_heads={cfg.n_heads} (or set model.head_dim)",
                       cfg.d_model)
  mem_len = cfg.get("mem_len")
  validation.require(isinstance(mem_len, int) and mem_len >= 0, "model.mem_len",
                     "an integer >= 0", mem_len)
  validation.require_probability(cfg.get("dropout"), "model.dropout")
  validation.require_probability(cfg.get("attn_dropout", 0.0), "model.attn_dropout")
  validation.require_choice(cfg.get("dtype", "float32"), "model.dtype", DTYPES)


class XLBlock(nnx.Module):
  """One pre-LN block: relative attention over `[memory; segment]`, then the FF slot."""

  def __init__(self, cfg: ml_collections.ConfigDict, *, rngs: nnx.Rngs):
    d = cfg.d_model
    self.attn_norm = nnx.LayerNorm(d, rngs=rngs)
    self.attn = RelativeMultiHeadAttention(
        d, cfg.n_heads, head_dim_of(cfg), n_layers=cfg.n_layers,
        attn_dropout=cfg.get("attn_dropout", 0.0), rngs=rngs)
    self.ff_norm = nnx.LayerNorm(d, rngs=rngs)
    self.ff = build_ff(cfg.ff, d_model=d, n_layers=cfg.n_layers, rngs=rngs)
    self.dropout = nnx.Dropout(cfg.dropout, rngs=rngs)

  def __call__(self, h_btd, mem_bmd, mem_valid):
    t = h_btd.shape[1]
    ctx_bkd = jnp.concatenate([mem_bmd.astype(h_btd.dtype), h_btd], axis=1)
    h_btd = h_btd + self.dropout(self.attn(self.attn_norm(ctx_bkd), t, mem_valid))
    y_btd, aux = self.ff(self.ff_norm(h_btd))
    return h_btd + self.dropout(y_btd), aux


class TransformerLM(nnx.Module):
  """Decoder LM: `logits, new_memory, aux = lm(tokens_bt, memory=None)`.

  `aux["reg_loss"]` is the sum of the FF layers' regularisers (already scaled by their
  coefficients; zero for dense). Other FF diagnostics appear as `aux["layer{i}/{key}"]`.
  """

  def __init__(self, cfg: ml_collections.ConfigDict, *, rngs: nnx.Rngs):
    validate_model_config(cfg)
    self.vocab_size, self.d_model, self.n_layers = cfg.vocab_size, cfg.d_model, cfg.n_layers
    self.mem_len = cfg.mem_len
    self.dtype = DTYPES[cfg.get("dtype", "float32")]
    self.tie_embeddings = bool(cfg.get("tie_embeddings", False))
    self.embed = nnx.Embed(cfg.vocab_size, cfg.d_model,
                           embedding_init=jax.nn.initializers.normal(1.0), rngs=rngs)
    self.embed_dropout = nnx.Dropout(cfg.dropout, rngs=rngs)
    self.blocks = nnx.List([XLBlock(cfg, rngs=rngs) for _ in range(cfg.n_layers)])
    self.final_norm = nnx.LayerNorm(cfg.d_model, rngs=rngs)
    if not self.tie_embeddings:
      out_std = 1.0 / math.sqrt(cfg.d_model)
      self.w_out = nnx.Param(initializers.normal(out_std)(rngs.params(),
                                                          (cfg.d_model, cfg.vocab_size)))
    self.b_out = nnx.Param(jnp.zeros((cfg.vocab_size,)))

  def init_memory(self, batch: int, mem_len: int | None = None) -> XLMemory:
    """An empty memory of `mem_len` positions (default: the model's training `mem_len`)."""
    mem_len = self.mem_len if mem_len is None else mem_len
    return XLMemory.empty(self.n_layers, batch, mem_len, self.d_model, self.dtype)

  def __call__(self, tokens_bt: jax.Array, memory: XLMemory | None = None):
    if memory is None:
      memory = self.init_memory(tokens_bt.shape[0])
    h_btd = self.embed_dropout(self.embed(tokens_bt).astype(self.dtype))
    layer_inputs, reg_loss, aux = [], jnp.zeros((), jnp.float32), {}
    for i, block in enumerate(self.blocks):
      layer_inputs.append(h_btd)
      h_btd, block_aux = block(h_btd, memory.hidden_lbmd[i], memory.valid)
      reg_loss = reg_loss + block_aux["reg_loss"].astype(jnp.float32)
      aux.update({f"layer{i}/{key}": value for key, value in block_aux.items()
                  if key != "reg_loss"})
    aux["reg_loss"] = reg_loss
    new_memory = memory.append(jnp.stack(layer_inputs))
    return self.logits(self.final_norm(h_btd)), new_memory, aux

  def logits(self, h_btd: jax.Array) -> jax.Array:
    """Output projection in float32; tied logits are scaled by `1/sqrt(d_model)`."""
    h_btd = h_btd.astype(jnp.float32)
    if self.tie_embeddings:
      w_dv = self.embed.embedding[...].T / math.sqrt(self.d_model)
    else:
      w_dv = self.w_out[...]
    return h_btd @ w_dv + self.b_out[...]
