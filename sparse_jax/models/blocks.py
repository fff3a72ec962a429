"""The pre-LN decoder block shared by every attention kind, for training and decoding.

`h + Drop(Attn(LN(h)))` then `h + Drop(FF(LN(h)))`, then the optional SPARTAN memory on the
block's output (`model.memory`, see `sparse_jax.models.plugins`); `model.adapters` puts
bottleneck adapters on the sublayers (`sparse_jax.layers.adapters`). The attention is chosen by
`model.attention`:

- `xl`: Transformer-XL relative attention over `[memory; segment]` (memory = the block's
  inputs from previous segments);
- `causal`: standard causal attention with dense Q, K, V and output (KV cache when decoding);
- `sparse_qkv`: Scaling Transformers' multiplicative + convolutional Q, K, V without an
  output layer (Sec. 3.2);
- `switchhead`: SwitchHead (Csordas et al. 2024), V and O projections as mixtures of experts
  per head (`layers.switchhead_attention`), causal with a KV cache; `switchhead_xl` the same
  with Transformer-XL relative positions over `[memory; segment]`, the paper's main rows.
  Their routers' token shares per head join the block's aux as `attn_v/token_share` and
  `attn_o/token_share` `[H, E]` (routing health per head, `training.routing_health`), their
  logits as `attn_v/logits` and `attn_o/logits`.

`model.block_norm="peri"` is MoEUT's peri-LayerNorm: the attention's queries, keys and routers
read `LN(h)` but SwitchHead's values read `h`; the sigma-MoE FF routes on `LN(h)` and its
experts read `h`. No LayerNorm sits on the residual path into the values or the experts.

`model.sequence_parallel` (Korthikanti et al. 2022, with `mesh.tensor` > 1): the residual
stream, LayerNorms, dropout and residual adds run on each device's `T / t` positions; the
sublayers, called within `layers.sequence_parallel.scope`, all-gather their input along T
where their tensor-parallel region begins and reduce-scatter their output where it ends.
"""

import jax
import jax.numpy as jnp
from flax import nnx

from sparse_jax.layers import sequence_parallel
from sparse_jax.layers.adapters import adapted_residual
from sparse_jax.layers.causal_attention import CausalSelfAttention
from sparse_jax.layers.normalization import layer_norm
from sparse_jax.layers.registry import build_ff
from sparse_jax.layers.sparse_qkv_attention import SparseQKVAttention
from sparse_jax.layers.switchhead_attention import SwitchHeadAttention, SwitchHeadXLAttention
from sparse_jax.layers.xl_attention import RelativeMultiHeadAttention
from sparse_jax.models import plugins
from sparse_jax.models.lm_config import XL_KINDS, LMConfig, head_dim_of, rotary_fraction_of
from sparse_jax.validation import ConfigError


def build_attention(cfg: LMConfig, rngs: nnx.Rngs) -> nnx.Module:
  """The attention layer of `model.attention`."""
  dropout, rotary = cfg.attn_dropout, cfg.positions == "rotary"
  if cfg.attention == "xl":
    return RelativeMultiHeadAttention(cfg.d_model, cfg.n_heads, head_dim_of(cfg),
                                      n_layers=cfg.n_layers, attn_dropout=dropout,
                                      learned_scale=cfg.attn_scale == "learned",
                                      bias_init_std=cfg.xl_bias_init_std,
                                      impl=cfg.attention_impl, rngs=rngs)
  if cfg.attention == "causal":
    return CausalSelfAttention(cfg.d_model, cfg.n_heads, head_dim_of(cfg),
                               n_layers=cfg.n_layers, attn_dropout=dropout, rotary=rotary,
                               rotary_fraction=rotary_fraction_of(cfg),
                               core=cfg.attention_core, rngs=rngs)
  if cfg.attention == "switchhead_xl":
    return SwitchHeadXLAttention(cfg.d_model, cfg.n_heads, head_dim_of(cfg),
                                 cfg.attention_experts, cfg.attention_k, n_layers=cfg.n_layers,
                                 attn_dropout=dropout, impl=cfg.attention_impl, rngs=rngs)
  if cfg.attention == "switchhead":
    return SwitchHeadAttention(cfg.d_model, cfg.n_heads, head_dim_of(cfg), cfg.attention_experts,
                               cfg.attention_k, n_layers=cfg.n_layers,
                               positions="rope" if rotary else "none",
                               rope_fraction=rotary_fraction_of(cfg), attn_dropout=dropout,
                               impl=cfg.attention_impl, core=cfg.attention_core, rngs=rngs)
  return SparseQKVAttention(cfg.d_model, cfg.n_heads, n_modules=cfg.attention_sparsity,
                            n_layers=cfg.n_layers, attn_dropout=dropout, rotary=rotary,
                            rngs=rngs)


def _scale_residual_outputs(layer: nnx.Module, scale: float) -> None:
  """Multiplies the initial weights of `layer`'s projections into the residual stream (named
  by its `RESIDUAL_OUTPUTS`) by `scale` (`model.residual_init_scale`)."""
  names = getattr(layer, "RESIDUAL_OUTPUTS", None)
  if names is None:
    raise ConfigError(f"config field 'model.residual_init_scale' must be 1 with "
                      f"{type(layer).__name__}, which does not name its residual outputs "
                      f"(RESIDUAL_OUTPUTS); got {scale}.")
  for name in names:
    param = getattr(layer, name)
    param[...] = param[...] * scale


class DecoderBlock(nnx.Module):
  """One pre-LN block: the attention of `model.attention`, the FF slot, the memory slot, and
  the adapters of `model.adapters` on the two sublayers (`layers.adapters`, LayerNorm-free)."""

  def __init__(self, cfg: LMConfig, *, rngs: nnx.Rngs):
    d = cfg.d_model
    self.is_xl = cfg.attention in XL_KINDS
    self.peri_norm = cfg.block_norm == "peri"
    self.attn_norm = layer_norm(d, epsilon=cfg.layer_norm_eps, rngs=rngs)
    self.attn = build_attention(cfg, rngs)
    self.ff_norm = layer_norm(d, epsilon=cfg.layer_norm_eps, rngs=rngs)
    self.ff = build_ff(cfg.ff, d_model=d, n_layers=cfg.n_layers, rngs=rngs)
    if cfg.residual_init_scale != 1:
      _scale_residual_outputs(self.attn, cfg.residual_init_scale)
      _scale_residual_outputs(self.ff, cfg.residual_init_scale)
    self.dropout = nnx.Dropout(cfg.dropout, rngs=rngs)
    self.memory = plugins.build_memory(cfg.memory, d, rngs)
    self.attn_adapter = plugins.build_adapter(cfg.adapters, d, "attn", rngs)
    self.ff_adapter = plugins.build_adapter(cfg.adapters, d, "ff", rngs)
    self.sequence_parallel = cfg.sequence_parallel

  def _feed_forward(self, h_btd, *, decoding: bool):
    """The FF sublayer, then the memory; when decoding, the FF's sparse `decode` path if any."""
    x_btd = self.ff_norm(h_btd)
    if self.peri_norm:
      y_btd, aux = self.ff(h_btd, sel_input=x_btd)
    elif decoding and self.ff.has_sparse_decode:
      y_btd, aux = self.ff.decode(x_btd), {"reg_loss": jnp.zeros((), jnp.float32)}
    else:
      y_btd, aux = self.ff(x_btd)
    h_btd = adapted_residual(self.ff_adapter, self.dropout(y_btd), h_btd)
    return plugins.apply_memory(self.memory, h_btd, aux)

  def _attend(self, h_btd, mem_bmd, mem_valid):
    """The attention sublayer's output and its routing aux (SwitchHead only, else empty).
    Under sequence parallelism XL attention's context `[memory; segment]` is normalised
    part by part (LayerNorm acts per position) and given as the parts, each on its sequence
    shards, which the attention gathers itself."""
    if self.is_xl:
      parts = (mem_bmd.astype(h_btd.dtype), h_btd)
      context = (tuple(self.attn_norm(x) for x in parts) if self.sequence_parallel
                 else self.attn_norm(jnp.concatenate(parts, axis=1)))
      args = (context, h_btd.shape[1], mem_valid)
    elif self.peri_norm:
      args = (self.attn_norm(h_btd), h_btd)  # SwitchHead's values read the raw residual.
    else:
      args = (self.attn_norm(h_btd),)
    if isinstance(self.attn, SwitchHeadAttention):
      attended, aux = self.attn.apply_with_aux(*args)
      return attended, {f"attn_{router}/{key}": aux[f"{router}_{key}"]
                        for router in ("v", "o") for key in ("token_share", "logits")}
    return self.attn(*args), {}

  def __call__(self, h_btd, mem_bmd, mem_valid, *, decoding: bool = False):
    """A segment `[B, T, d]`; `mem_bmd`/`mem_valid` are used by XL attention only."""
    with sequence_parallel.scope(self.sequence_parallel and not decoding):
      attended, attn_aux = self._attend(h_btd, mem_bmd, mem_valid)
      h_btd = adapted_residual(self.attn_adapter, self.dropout(attended), h_btd)
      h_btd, aux = self._feed_forward(h_btd, decoding=decoding)
    return h_btd, {**attn_aux, **aux}

  def decode(self, h_b1d: jax.Array, cache: dict, position: jax.Array):
    """One token of a non-XL block from its attention cache: `(h, cache)`."""
    values = (h_b1d,) if self.peri_norm else ()
    attended, cache = self.attn.decode(self.attn_norm(h_b1d), cache, position, *values)
    h_b1d = adapted_residual(self.attn_adapter, self.dropout(attended), h_b1d)
    h_b1d, _ = self._feed_forward(h_b1d, decoding=True)
    return h_b1d, cache
