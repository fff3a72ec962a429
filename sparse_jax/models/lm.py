"""`TransformerLM`: a pre-LN decoder LM for every attention and feed-forward kind.

Training: `logits, new_memory, aux = lm(tokens_bt, memory=None)`; with Transformer-XL
attention (`model.attention = "xl"`) each layer's memory is the stop-gradient of its input
from previous segments (Dai et al. 2019), so context carries across segments; the other kinds
(`causal`, `sparse_qkv`) see one segment and their memory is empty.
Decoding: `cache = lm.init_cache(batch, max_len)`, `logits, cache = lm.decode_step(tokens_b1,
cache)`: a KV cache for `causal`/`sparse_qkv`, the XL memory for `xl`; sparse FF layers use
their sparse decode path.
"""

import math

import jax
import jax.numpy as jnp
import ml_collections
from flax import nnx

from sparse_jax import validation
from sparse_jax.layers import initializers
from sparse_jax.layers.multiplicative_dense import MultiplicativeDense
from sparse_jax.layers.xl_attention import sinusoid_embedding
from sparse_jax.models import plugins
from sparse_jax.models.blocks import ATTENTION_KINDS, POSITIONS, DecoderBlock
from sparse_jax.models.xl_memory import XLMemory

DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}


def validate_model_config(cfg: ml_collections.ConfigDict) -> None:
  """Checks the `model` section; the FF fields are checked by their registry builder."""
  for name in ("vocab_size", "d_model", "n_layers", "n_heads"):
    validation.require_positive_int(cfg.get(name), f"model.{name}")
  attention = cfg.get("attention", "xl")
  validation.require_choice(attention, "model.attention", ATTENTION_KINDS)
  if cfg.get("head_dim"):
    validation.require_positive_int(cfg.head_dim, "model.head_dim")
  if attention == "sparse_qkv" or not cfg.get("head_dim"):
    validation.require(cfg.d_model % cfg.n_heads == 0, "model.d_model",
                       f"divisible by model.n_heads={cfg.n_heads} (or set model.head_dim, "
                       "except for sparse_qkv attention)", cfg.d_model)
  mem_len = cfg.get("mem_len")
  validation.require(isinstance(mem_len, int) and mem_len >= 0, "model.mem_len",
                     "an integer >= 0", mem_len)
  validation.require_probability(cfg.get("dropout"), "model.dropout")
  validation.require_probability(cfg.get("attn_dropout", 0.0), "model.attn_dropout")
  validation.require_choice(cfg.get("dtype", "float32"), "model.dtype", DTYPES)
  validation.require_choice(cfg.get("positions", "rotary"), "model.positions", POSITIONS)
  loss_sparsity = cfg.get("loss_sparsity", 0)
  validation.require(
      isinstance(loss_sparsity, int) and loss_sparsity >= 0
      and (loss_sparsity == 0 or cfg.vocab_size % loss_sparsity == 0),
      "model.loss_sparsity", f"0 (dense) or a divisor of model.vocab_size={cfg.vocab_size}",
      loss_sparsity)
  validation.require(not (loss_sparsity and cfg.get("tie_embeddings", False)),
                     "model.tie_embeddings", "False with model.loss_sparsity", True)
  validation.require(plugins.adapter_kind(cfg) == "none", "model.adapters.kind",
                     "'none' in a decoder LM (adapters are placed in encoder layers)",
                     plugins.adapter_kind(cfg))


class TransformerLM(nnx.Module):
  """Decoder LM (see the module docstring for the calls).

  `aux["reg_loss"]` is the sum of the FF layers' regularisers (already scaled by their
  coefficients; zero for dense). Other FF diagnostics appear as `aux["layer{i}/{key}"]`.
  The output projection is dense, tied to the embedding (`tie_embeddings`) or, with
  `loss_sparsity` S > 0, the multiplicative layer of Scaling Transformers (Sec. 3.3).
  """

  def __init__(self, cfg: ml_collections.ConfigDict, *, rngs: nnx.Rngs):
    validate_model_config(cfg)
    self.vocab_size, self.d_model, self.n_layers = cfg.vocab_size, cfg.d_model, cfg.n_layers
    self.is_xl = cfg.get("attention", "xl") == "xl"
    self.sinusoidal = not self.is_xl and cfg.get("positions", "rotary") == "sinusoidal"
    self.mem_len = cfg.mem_len if self.is_xl else 0
    self.dtype = DTYPES[cfg.get("dtype", "float32")]
    self.tie_embeddings = bool(cfg.get("tie_embeddings", False))
    self.embed = nnx.Embed(cfg.vocab_size, cfg.d_model,
                           embedding_init=jax.nn.initializers.normal(1.0), rngs=rngs)
    self.embed_dropout = nnx.Dropout(cfg.dropout, rngs=rngs)
    self.blocks = nnx.List([DecoderBlock(cfg, rngs=rngs) for _ in range(cfg.n_layers)])
    self.final_norm = nnx.LayerNorm(cfg.d_model, rngs=rngs)
    loss_sparsity = cfg.get("loss_sparsity", 0)
    if loss_sparsity:
      self.sparse_out = MultiplicativeDense(cfg.d_model, cfg.vocab_size, loss_sparsity,
                                            rngs=rngs)
    elif not self.tie_embeddings:
      out_std = 1.0 / math.sqrt(cfg.d_model)
      self.w_out = nnx.Param(initializers.normal(out_std)(rngs.params(),
                                                          (cfg.d_model, cfg.vocab_size)))
    self.b_out = nnx.Param(jnp.zeros((cfg.vocab_size,)))

  def init_memory(self, batch: int, mem_len: int | None = None) -> XLMemory:
    """An empty memory of `mem_len` positions (default `model.mem_len`; 0 unless XL)."""
    mem_len = self.mem_len if mem_len is None or not self.is_xl else mem_len
    return XLMemory.empty(self.n_layers, batch, mem_len, self.d_model, self.dtype)

  def _embed(self, tokens_bt: jax.Array, first_position) -> jax.Array:
    h_btd = self.embed(tokens_bt).astype(self.dtype)
    if self.sinusoidal:
      positions_t = first_position + jnp.arange(tokens_bt.shape[1])
      h_btd = h_btd + sinusoid_embedding(positions_t, self.d_model).astype(self.dtype)
    return self.embed_dropout(h_btd)

  def __call__(self, tokens_bt: jax.Array, memory: XLMemory | None = None, *,
               decoding: bool = False):
    h_btd, new_memory, aux = self.hidden_states(tokens_bt, memory, decoding=decoding)
    return self.logits(h_btd), new_memory, aux

  def hidden_states(self, tokens_bt: jax.Array, memory: XLMemory | None = None, *,
                    decoding: bool = False):
    """The final-LayerNorm hidden states `[B, T, d]` (what the logits read), memory, aux."""
    if memory is None:
      memory = self.init_memory(tokens_bt.shape[0])
    h_btd = self._embed(tokens_bt, 0)
    layer_inputs, reg_loss, aux = [], jnp.zeros((), jnp.float32), {}
    for i, block in enumerate(self.blocks):
      layer_inputs.append(h_btd)
      h_btd, block_aux = block(h_btd, memory.hidden_lbmd[i], memory.valid, decoding=decoding)
      reg_loss = reg_loss + block_aux["reg_loss"].astype(jnp.float32)
      aux.update({f"layer{i}/{key}": value for key, value in block_aux.items()
                  if key != "reg_loss"})
    aux["reg_loss"] = reg_loss
    new_memory = memory.append(jnp.stack(layer_inputs))
    return self.final_norm(h_btd), new_memory, aux

  def logits(self, h_btd: jax.Array) -> jax.Array:
    """Output projection in float32; tied logits are scaled by `1/sqrt(d_model)`."""
    h_btd = h_btd.astype(jnp.float32)
    if hasattr(self, "sparse_out"):
      return self.sparse_out(h_btd) + self.b_out[...]
    if self.tie_embeddings:
      w_dv = self.embed.embedding[...].T / math.sqrt(self.d_model)
    else:
      w_dv = self.w_out[...]
    return h_btd @ w_dv + self.b_out[...]

  def init_cache(self, batch: int, max_len: int):
    """Decoding state for up to `max_len` tokens: the XL memory, or per-layer KV caches."""
    if self.is_xl:
      return self.init_memory(batch, max_len)
    return {"position": jnp.zeros((), jnp.int32),
            "layers": [block.attn.init_cache(batch, max_len, self.dtype)
                       for block in self.blocks]}

  def decode_step(self, tokens_b1: jax.Array, cache):
    """Logits `[B, 1, V]` of the next token after `tokens_b1`, and the updated cache."""
    if self.is_xl:
      logits, cache, _ = self(tokens_b1, cache, decoding=True)
      return logits, cache
    position = cache["position"]
    h_b1d = self._embed(tokens_b1, position)
    layers = []
    for block, layer_cache in zip(self.blocks, cache["layers"]):
      h_b1d, layer_cache = block.decode(h_b1d, layer_cache, position)
      layers.append(layer_cache)
    logits = self.logits(self.final_norm(h_b1d))
    return logits, {"position": position + 1, "layers": layers}
