"""`TransformerLM`: a pre-LN decoder LM for every attention and feed-forward kind.

Training: `logits, new_memory, aux = lm(tokens_bt, memory=None)`; with Transformer-XL
attention (`model.attention` "xl" or "switchhead_xl") each layer's memory is the
stop-gradient of its input from previous segments (Dai et al. 2019), so context carries across
segments; the other kinds (`causal`, `sparse_qkv`, `switchhead`) see one segment and their
memory is empty. Decoding: `cache = lm.init_cache(batch, max_len)`, `logits, cache =
lm.decode_step(tokens_b1, cache)`: a KV cache for `causal`/`sparse_qkv`/`switchhead`, the XL
memory for the XL kinds; sparse FF layers use
their sparse decode path. The `model` section's schema is `models.lm_config.LMConfig`.

MoEUT (Csordas et al. 2024) is this LM with `model.layer_groups` G < `n_layers` (G blocks
repeated in order, each repeat its own cache and memory rows), `model.block_norm="peri"`,
SwitchHead attention, a sigma-MoE FF and `model.moeut_ff_reg` / `moeut_attention_reg`
(`sparse_jax/configs/moeut_paper.py`).
"""

import math

import jax
import jax.numpy as jnp
import ml_collections
from flax import nnx

from sparse_jax import parallel
from sparse_jax.layers import sequence_parallel
from sparse_jax.layers.multiplicative_dense import MultiplicativeDense
from sparse_jax.layers.normalization import layer_norm
from sparse_jax.layers.precision import COMPUTE_DTYPES, f32_einsum
from sparse_jax.layers.xl_attention import sinusoid_embedding
from sparse_jax.models.blocks import DecoderBlock
from sparse_jax.models.layer_scan import scan_layers
from sparse_jax.models.lm_config import (EMBED_INITS, XL_KINDS, LMConfig,
                                         validate_model_config)
from sparse_jax.models.moeut_regularizer import moeut_regularizer
from sparse_jax.models.remat import rematerialized
from sparse_jax.models.xl_memory import XLMemory


def _scaled(init: jax.nn.initializers.Initializer, scale: float):
  """`init`'s draw times `scale` (`model.embed_init_scale`)."""
  if scale == 1:
    return init
  return lambda key, shape, dtype=jnp.float32: init(key, shape, dtype) * scale


def _call_block(block: DecoderBlock, h_btd, mem_bmd, mem_valid):
  return block(h_btd, mem_bmd, mem_valid)


def _decode_block(block: DecoderBlock, h_btd, mem_bmd, mem_valid):
  return block(h_btd, mem_bmd, mem_valid, decoding=True)


class TransformerLM(nnx.Module):
  """Decoder LM (see the module docstring for the calls).

  `aux["reg_loss"]` is the sum of the FF layers' regularisers (already scaled by their
  coefficients; zero for dense). Other FF diagnostics appear as `aux["layer{i}/{key}"]`.
  The output projection is dense, tied to the embedding (`tie_embeddings`) or, with
  `loss_sparsity` S > 0, the multiplicative layer of Scaling Transformers (Sec. 3.3); it has
  a bias, and with `output_dropout` its input drops out at `model.dropout`.
  """

  def __init__(self, cfg: ml_collections.ConfigDict | dict | LMConfig, *, rngs: nnx.Rngs):
    cfg = validate_model_config(cfg)
    self.vocab_size, self.d_model, self.n_layers = cfg.vocab_size, cfg.d_model, cfg.n_layers
    self.is_xl = cfg.attention in XL_KINDS
    self.sinusoidal = not self.is_xl and cfg.positions == "sinusoidal"
    self.mem_len = cfg.mem_len if self.is_xl else 0
    self.dtype = COMPUTE_DTYPES[cfg.dtype]
    self.remat = cfg.remat
    self.scan = cfg.scan_layers
    self.sequence_parallel = cfg.sequence_parallel
    self.embed = nnx.Embed(cfg.vocab_size, cfg.d_model,
                           embedding_init=_scaled(EMBED_INITS[cfg.embed_init],
                                                  cfg.embed_init_scale),
                           embedding_metadata={"logical_axes": ("vocab", "embed")}, rngs=rngs)
    self.embed_multiplier = cfg.embed_multiplier
    self.embed_dropout = nnx.Dropout(cfg.dropout, rngs=rngs)
    # MoEUT: `layer_groups` distinct blocks, layer i running block i % G (`layer_blocks`).
    self.n_groups = cfg.layer_groups or cfg.n_layers
    self.blocks = nnx.List([DecoderBlock(cfg, rngs=rngs) for _ in range(self.n_groups)])
    self.moeut_ff_reg, self.moeut_attention_reg = cfg.moeut_ff_reg, cfg.moeut_attention_reg
    self.final_norm = layer_norm(cfg.d_model, epsilon=cfg.layer_norm_eps, rngs=rngs)
    self.output_dropout = nnx.Dropout(cfg.dropout if cfg.output_dropout else 0.0, rngs=rngs)
    # The output projection: "sparse" (multiplicative), "tied" (to the embedding) or "dense".
    self.output_kind = ("sparse" if cfg.loss_sparsity else "tied" if cfg.tie_embeddings
                        else "dense")
    if self.output_kind == "sparse":  # S x M modules factor the vocabulary.
      self.sparse_out = MultiplicativeDense(cfg.d_model, cfg.vocab_size, cfg.loss_sparsity,
                                            out_axes=("vocab", "vocab_module"), rngs=rngs)
    elif self.output_kind == "dense":
      out_std = 1.0 / math.sqrt(cfg.d_model)
      self.w_out = nnx.Param(jax.nn.initializers.normal(out_std)(rngs.params(),
                                                          (cfg.d_model, cfg.vocab_size)),
                             logical_axes=("embed", "vocab"))
    self.b_out = nnx.Param(jnp.zeros((cfg.vocab_size,)), logical_axes=("vocab",))

  @property
  def layer_blocks(self) -> list[DecoderBlock]:
    """The block of each of the `n_layers` layers, in order (a shared one at each repeat)."""
    return [self.blocks[i % self.n_groups] for i in range(self.n_layers)]

  def init_memory(self, batch: int, mem_len: int | None = None) -> XLMemory:
    """An empty memory of `mem_len` positions (default `model.mem_len`; 0 unless XL)."""
    mem_len = self.mem_len if mem_len is None or not self.is_xl else mem_len
    return XLMemory.empty(self.n_layers, batch, mem_len, self.d_model, self.dtype)

  def _embed(self, tokens_bt: jax.Array, first_position) -> jax.Array:
    h_btd = self.embed(tokens_bt).astype(self.dtype)
    if self.embed_multiplier != 1:
      h_btd = h_btd * jnp.asarray(self.embed_multiplier, self.dtype)
    if self.sinusoidal:
      positions_t = first_position + jnp.arange(tokens_bt.shape[1])
      h_btd = h_btd + sinusoid_embedding(positions_t, self.d_model).astype(self.dtype)
    return self.embed_dropout(h_btd)

  def __call__(self, tokens_bt: jax.Array, memory: XLMemory | None = None, *,
               decoding: bool = False):
    h_btd, new_memory, aux = self.hidden_states(tokens_bt, memory, decoding=decoding)
    with sequence_parallel.scope(self.sequence_parallel and not decoding):
      return self.logits(h_btd), new_memory, aux

  def hidden_states(self, tokens_bt: jax.Array, memory: XLMemory | None = None, *,
                    decoding: bool = False):
    """The final-LayerNorm hidden states `[B, T, d]` (what the logits read, after the output
    dropout when `model.output_dropout`), memory, aux."""
    if memory is None:
      memory = self.init_memory(tokens_bt.shape[0])
    h_btd = self._embed(tokens_bt, 0)
    if self.sequence_parallel:  # The vocabulary-split lookup's sums, then each one's shard.
      h_btd = parallel.sequence_shards(parallel.whole_sequences(h_btd))
    call = (_decode_block if decoding
            else rematerialized(_call_block, self.remat, scanned=self.scan))
    h_btd, inputs_lbtd, layer_aux = self._layers(call, h_btd, memory)
    reg_loss, aux = jnp.zeros((), jnp.float32), {}
    for i, block_aux in enumerate(layer_aux):
      reg_loss = reg_loss + block_aux["reg_loss"].astype(jnp.float32)
      aux.update({f"layer{i}/{key}": value for key, value in block_aux.items()
                  if key != "reg_loss"})
    if self.moeut_ff_reg or self.moeut_attention_reg:
      reg_loss = reg_loss + moeut_regularizer(aux, self.n_layers, self.n_groups,
                                              ff_coef=self.moeut_ff_reg,
                                              attention_coef=self.moeut_attention_reg)
    aux["reg_loss"] = reg_loss
    new_memory = memory.append(inputs_lbtd)
    return self.output_dropout(self.final_norm(h_btd)), new_memory, aux

  def _layers(self, call, h_btd, memory: XLMemory):
    """`(h_btd, inputs_lbtd, layer_aux)` after every layer, unrolled or under one scan
    (`model.scan_layers`, `models.layer_scan`)."""
    if self.scan:
      return scan_layers(list(self.blocks), self.n_layers, call, h_btd, memory.hidden_lbmd,
                         memory.valid)
    inputs, layer_aux = [], []
    for i, block in enumerate(self.layer_blocks):
      inputs.append(h_btd)
      h_btd, block_aux = call(block, h_btd, memory.hidden_lbmd[i], memory.valid)
      layer_aux.append(block_aux)
    return h_btd, jnp.stack(inputs), layer_aux

  def logits(self, h_btd: jax.Array) -> jax.Array:
    """Float32 logits from compute-dtype matmuls (`layers.precision`; the multiplicative
    output's rounded to the compute dtype); tied logits are scaled by `1/sqrt(d_model)`.
    Under sequence parallelism `h_btd` is on sequence shards, all-gathered for the
    vocabulary-split output layer (its input gradient reduce-scattered)."""
    h_btd = h_btd.astype(self.dtype)
    if self.output_kind == "sparse":
      return self.sparse_out(h_btd).astype(jnp.float32) + self.b_out[...]
    if self.output_kind == "tied":
      w_dv = self.embed.embedding[...].T / math.sqrt(self.d_model)
    else:
      w_dv = self.w_out[...]
    logits_btv, = sequence_parallel.column_parallel(
        lambda h, w: (f32_einsum("...d,dv->...v", h, w),), [h_btd],
        [(w_dv.astype(self.dtype), ("embed", "vocab"))], [("batch", None, "vocab")])
    return logits_btv + self.b_out[...]

  def init_cache(self, batch: int, max_len: int):
    """Decoding state for up to `max_len` tokens: the XL memory, or per-layer KV caches."""
    if self.is_xl:
      return self.init_memory(batch, max_len)
    return {"position": jnp.zeros((), jnp.int32),
            "layers": [block.attn.init_cache(batch, max_len, self.dtype)
                       for block in self.layer_blocks]}

  def decode_step(self, tokens_b1: jax.Array, cache):
    """Logits `[B, 1, V]` of the next token after `tokens_b1`, and the updated cache."""
    if self.is_xl:
      logits, cache, _ = self(tokens_b1, cache, decoding=True)
      return logits, cache
    position = cache["position"]
    h_b1d = self._embed(tokens_b1, position)
    layers = []
    for block, layer_cache in zip(self.layer_blocks, cache["layers"]):
      h_b1d, layer_cache = block.decode(h_b1d, layer_cache, position)
      layers.append(layer_cache)
    logits = self.logits(self.final_norm(h_b1d))
    return logits, {"position": position + 1, "layers": layers}
