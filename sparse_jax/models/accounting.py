"""Parameter and FLOP accounting for parameter-matched comparisons (sigma-MoE Table 3/4), and
the model FLOPs of a training step (`lm_step_flops`, `classifier_step_flops`,
`terraformer_step_flops`: what `tflops_per_device` and `mfu` count, `training.mfu`).

Layers are built abstractly (`nnx.eval_shape`), so counting a 262M-parameter config
allocates nothing.
"""

import copy
import dataclasses

import jax
import ml_collections
from flax import nnx

from sparse_jax.layers.adapters import BottleneckAdapter
from sparse_jax.layers.bidirectional_attention import BidirectionalSelfAttention
from sparse_jax.layers.counting import count_params
from sparse_jax.layers.lsh_attention import LSHSelfAttention
from sparse_jax.layers.registry import build_ff, parse_ff
from sparse_jax.layers.switchhead_attention import SwitchHeadXLAttention
from sparse_jax.layers.xl_attention import RelativeMultiHeadAttention
from sparse_jax.models.blocks import build_attention
from sparse_jax.models.classifier import SequenceClassifier
from sparse_jax.models.encoder import Encoder
from sparse_jax.models.lm import TransformerLM
from sparse_jax.models.lm_config import (SWITCHHEAD_KINDS, XL_KINDS, ModelConfig, head_dim_of,
                                         validate_model_config)
from sparse_jax.models.terraformer import Terraformer
from sparse_jax.models.terraformer_blocks import AttentionHalf


def ff_layer_stats(model_cfg: ml_collections.ConfigDict | ModelConfig) -> dict[str, int]:
  """Parameters and multiply-adds per token of one FF layer of `model_cfg`."""
  cfg = ModelConfig.parse(model_cfg, "model")
  ff = nnx.eval_shape(lambda: build_ff(cfg.ff, d_model=cfg.d_model, n_layers=cfg.n_layers,
                                       rngs=nnx.Rngs(0)))
  return {"params": count_params(ff), "flops_per_token": ff.flops_per_token()}


def matched_dense_d_ff(model_cfg: ml_collections.ConfigDict) -> int:
  """The dense `d_ff` whose FF layer (with biases) has as many parameters as `model.ff`.

  A dense layer has `2 d_model d_ff + d_ff + d_model` parameters; e.g. sigma-MoE WT-S
  (d_model 412, 16 experts of 128 plus the selector) gives the paper's 2053.
  """
  d = model_cfg.d_model
  return round((ff_layer_stats(model_cfg)["params"] - d) / (2 * d + 1))


def matched_dense_config(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """A copy of an experiment config with its FF replaced by the parameter-matched dense one
  (keeping the FF's dropout, for the kinds that have one)."""
  dense = copy.deepcopy(config)
  dense.model.ff = ml_collections.ConfigDict(
      {"kind": "dense", "d_ff": matched_dense_d_ff(config.model)})
  if "dropout" in config.model.ff:
    dense.model.ff.dropout = config.model.ff.dropout
  return dense


def model_report(model_cfg: ml_collections.ConfigDict) -> dict[str, float]:
  """Total parameters, FF parameters and the FF FLOPs as % of the matched dense FF."""
  lm = nnx.eval_shape(lambda: TransformerLM(model_cfg, rngs=nnx.Rngs(0)))
  ff = ff_layer_stats(model_cfg)
  dense_flops = 2 * model_cfg.d_model * matched_dense_d_ff(model_cfg)
  return {"total_params": count_params(lm),
          "ff_params_per_layer": ff["params"],
          "ff_flops_per_token": ff["flops_per_token"],
          "matched_dense_d_ff": matched_dense_d_ff(model_cfg),
          "ff_flops_percent_of_dense": 100.0 * ff["flops_per_token"] / dense_flops}


def attention_params(model_cfg: ml_collections.ConfigDict) -> int:
  """Parameters of one attention layer of `model_cfg` (its `model.attention` kind)."""
  cfg = validate_model_config(model_cfg)
  return count_params(nnx.eval_shape(lambda: build_attention(cfg, nnx.Rngs(0))))


def attention_report(model_cfg: ml_collections.ConfigDict | ModelConfig,
                     seq_len: int) -> dict[str, int]:
  """One attention layer's parameters, and its MACs and activation memory (floats) as the
  SwitchHead paper counts them (the authors' `paper/common.py`, `get_attention_flops` and
  `get_attention_mem`): one layer, one segment of T = `seq_len` tokens (batch 1), forward, over
  `c = mem_len / T` segments of XL memory (0 without XL). The paper's own figures: WT-103
  small dense 10 x 41 453.4M MACs, SwitchHead 2 x 76 (E 5, K 2) 170.4M.

  Dense (`xl`, `causal`): `2 H Dh T^2 (1 + c)` (scores and weighted values) `+ 4 d H Dh T`
  (Q, K, V, O) `+ 2 H d Dh T (1 + c)` (the XL position projection). SwitchHead (V and O
  experts, two routers): the same first term, `(2K + 2) d H Dh T` (each expert projection K
  times), `2 H K Dh T` (the K-sums), `2 E d T (1 + c)` (routers) and, XL only, `2 H d Dh T`:
  their formula counts SwitchHead's position projection over T rows where dense's is over
  T (1 + c); kept as they wrote it. Memory: `2 H T^2 (1 + c) + 4 H Dh T`, plus `2 H Dh T (1 + c)`
  (dense XL) or `2 E T (1 + c)` and, XL, `2 H Dh T` (SwitchHead). Sparse QKV has no such
  formula: MACs and memory are left out.
  """
  cfg = validate_model_config(model_cfg)
  report = {"attention_params_per_layer": attention_params(cfg)}
  if cfg.attention == "sparse_qkv":
    return report
  d, h, dh, t = cfg.d_model, cfg.n_heads, head_dim_of(cfg), seq_len
  xl = cfg.attention in XL_KINDS
  c = cfg.mem_len / t if xl else 0.0
  macs = 2 * h * dh * t * t * (1 + c)
  memory = 2 * h * t * t * (1 + c) + 4 * h * dh * t
  if cfg.attention in SWITCHHEAD_KINDS:
    e, k = cfg.attention_experts, cfg.attention_k
    macs += (2 * k + 2) * d * h * dh * t + 2 * h * k * t * dh + 2 * e * d * t * (1 + c)
    memory += 2 * e * t * (1 + c)
    if xl:
      macs, memory = macs + 2 * h * d * t * dh, memory + 2 * h * t * dh
  else:
    macs += 4 * d * h * dh * t
    if xl:
      macs, memory = macs + 2 * h * d * t * dh * (1 + c), memory + 2 * h * t * dh * (1 + c)
  return {**report, "attention_macs_per_layer": round(macs),
          "attention_memory_floats_per_layer": round(memory)}


def match_block_params(model_cfg: ml_collections.ConfigDict, target: int,
                       step: int = 1) -> int:
  """The largest `model.ff.d_ff` (a multiple of `step`) whose attention + FF parameters per
  block do not exceed `target`: how the Scaling Transformers keep the parameter count when
  their sparse QKV frees attention parameters (Sec. 3.2)."""
  budget = target - attention_params(model_cfg)
  cfg = validate_model_config(model_cfg)

  def ff_params(d_ff: int) -> int:
    ff = parse_ff({**cfg.ff.to_dict(), "d_ff": d_ff})
    return ff_layer_stats(dataclasses.replace(cfg, ff=ff))["params"]

  lo, hi = 1, max(1, budget // cfg.d_model // step)
  while lo < hi:
    mid = (lo + hi + 1) // 2
    lo, hi = (mid, hi) if ff_params(mid * step) <= budget else (lo, mid - 1)
  return lo * step


# Model FLOPs of one training step. Each model's forward pass is listed as `Matmuls` parts in
# the order it runs them, counted from the layers' own `flops_per_token` where they have one;
# `step_flops` adds the backward pass.


@dataclasses.dataclass(frozen=True)
class Matmuls:
  """The multiply-adds of one part of a forward pass over the whole batch.

  `trains`: the part's weights get gradients (`macs = 0` marks a trained LayerNorm or
  embedding: gradients flow from there on). `activations`: both operands are activations
  (attention scores, the weighted sum of values), so the backward pass takes two products of
  the forward's size. `input_grad=False`: no gradient reaches the part's input (the XL
  memory's stop-gradient rows, constants, the discrete LSH hash).
  """

  macs: int
  trains: bool
  activations: bool = False
  input_grad: bool = True


def step_flops(parts: list[Matmuls]) -> int:
  """Model FLOPs of a training step whose forward pass is `parts`, in order.

  2 FLOPs per multiply-add. Each part runs forward once; the backward pass computes its input
  gradient when an earlier part trains (the gradient must reach that part) and its weight
  gradient when it trains. So a trained matmul costs 3x its forward (the usual `6 N` FLOPs
  per token), a frozen one that the gradient crosses 2x, one below every trained part 1x, and
  attention's activation products 3x wherever the gradient crosses them. Rematerialisation
  and reversible recomputation are not counted: model FLOPs, not hardware FLOPs.
  """
  total, reached = 0, False
  for part in parts:
    grad_in = reached and part.input_grad
    backward = 2 * grad_in if part.activations else grad_in + part.trains
    total += 2 * part.macs * (1 + backward)
    reached = reached or part.trains
  return total


def _trains(node, wrt) -> bool:
  """Whether a module or parameter holds parameters that `wrt` (an NNX filter) trains."""
  if isinstance(node, nnx.Variable):
    return nnx.filterlib.to_predicate(wrt)((), node)
  return bool(jax.tree.leaves(nnx.state(node, wrt)))


def _norm(norm: nnx.Module, wrt) -> Matmuls:
  """A LayerNorm: no matmul, but gradients flow from it when it trains."""
  return Matmuls(0, _trains(norm, wrt))


def _layer(layer: nnx.Module | None, tokens: int, wrt) -> list[Matmuls]:
  """A position-wise layer (`flops_per_token`: FF, SPARTAN memory, adapter, SRU) on `tokens`;
  nothing for an absent plug-in (None). An adapter is its down then its up projection: when
  it is the lowest trained part (over a frozen backbone), only the up one takes an input
  gradient."""
  if layer is None:
    return []
  macs, trains = tokens * layer.flops_per_token(), _trains(layer, wrt)
  if isinstance(layer, BottleneckAdapter):
    return [Matmuls(macs // 2, trains), Matmuls(macs - macs // 2, trains)]
  return [Matmuls(macs, trains)]


def _self_attention(attn: nnx.Module, d_model: int, batch: int, t: int, wrt,
                    mem_rows: int = 0) -> list[Matmuls]:
  """One self-attention layer on `batch` sequences of `t` tokens: its projections, then `2 H Dh`
  multiply-adds per (query, key) pair the mask lets through (XL and SwitchHead XL: `3 H Dh`,
  the position scores too). Pairs: causal `t (t + 1) / 2` plus `t mem_rows` over the XL
  memory (`mem_rows` valid rows, which also take the K and V projections); bidirectional
  `t^2` (padding keys included); LSH `t N W` (`N` hashes, window `W`), plus the hashing.
  """
  trains, hd = _trains(attn, wrt), attn.n_heads * attn.head_dim
  products, projections = 2, [Matmuls(batch * t * 4 * d_model * hd, trains)]
  if isinstance(attn, SwitchHeadXLAttention):  # memory rows: K, V experts, V router (half)
    products, pairs = 3, t * mem_rows + t * (t + 1) // 2
    projections = [Matmuls(batch * t * attn.flops_per_token(), trains),
                   Matmuls(batch * mem_rows * attn.flops_per_token() // 2, trains,
                           input_grad=False),
                   Matmuls((mem_rows + t) * d_model * hd, trains, input_grad=False)]  # W_pos
  elif isinstance(attn, RelativeMultiHeadAttention):
    products, pairs = 3, t * mem_rows + t * (t + 1) // 2
    projections += [Matmuls(batch * mem_rows * 2 * d_model * hd, trains, input_grad=False),
                    Matmuls((mem_rows + t) * d_model * hd, trains, input_grad=False)]  # R
  elif isinstance(attn, LSHSelfAttention):
    window = attn.chunk_len * (attn.n_chunks_before + 1 + attn.n_chunks_after)
    pairs = t * attn.n_hashes * window
    hashing = batch * t * hd * attn.n_hashes * attn.n_buckets // 2
    projections = [Matmuls(batch * t * attn.flops_per_token(), trains),
                   Matmuls(hashing, False, input_grad=False)]
  elif isinstance(attn, BidirectionalSelfAttention):
    pairs = t * t
  else:  # Causal, with dense (4 d H Dh) or sparse QKV projections.
    pairs = t * (t + 1) // 2
    projections = [Matmuls(batch * t * attn.flops_per_token(), trains)]
  return [*projections, Matmuls(products * batch * hd * pairs, False, activations=True)]


def _output_layer(model: TransformerLM | Terraformer, tokens: int, wrt) -> Matmuls:
  """The dense, tied or multiplicative (`sparse_out`) projection to the vocabulary."""
  sparse = getattr(model, "sparse_out", None)
  if sparse is not None:
    return Matmuls(tokens * sparse.flops_per_token(), _trains(sparse, wrt))
  weight = model.embed if getattr(model, "output_kind", "dense") == "tied" else model.w_out
  return Matmuls(tokens * model.d_model * model.vocab_size, _trains(weight, wrt))


def _lm_hidden(lm: TransformerLM, batch: int, t: int, mem_rows: int, wrt) -> list[Matmuls]:
  """`TransformerLM.hidden_states`: embedding, the pre-LN blocks, the final LayerNorm."""
  parts, tokens = [Matmuls(0, _trains(lm.embed, wrt))], batch * t
  for block in lm.layer_blocks:
    parts += [_norm(block.attn_norm, wrt),
              *_self_attention(block.attn, lm.d_model, batch, t, wrt, mem_rows),
              *_layer(block.attn_adapter, tokens, wrt), _norm(block.ff_norm, wrt),
              *_layer(block.ff, tokens, wrt), *_layer(block.ff_adapter, tokens, wrt),
              *_layer(block.memory, tokens, wrt)]
  return parts + [_norm(lm.final_norm, wrt)]


def lm_step_flops(lm: TransformerLM, batch: int, seq_len: int, *, wrt=nnx.Param) -> int:
  """Model FLOPs of a training step of `lm` on `batch` segments of `seq_len` tokens, with a
  full XL memory (`mem_len` rows: every step but a stream's first)."""
  return step_flops([*_lm_hidden(lm, batch, seq_len, lm.mem_len, wrt),
                     _output_layer(lm, batch * seq_len, wrt)])


def _encoder_hidden(encoder: Encoder, batch: int, t: int, wrt) -> list[Matmuls]:
  """`Encoder`: embeddings and their LayerNorm, then the post-LN layers."""
  embeddings = (encoder.word_embeddings, encoder.position_embeddings, encoder.type_embeddings)
  parts = [Matmuls(0, any(_trains(e, wrt) for e in embeddings)), _norm(encoder.embed_norm, wrt)]
  tokens = batch * t
  for layer in encoder.layers:
    parts += [*_self_attention(layer.attn, encoder.d_model, batch, t, wrt),
              *_layer(layer.attn_adapter, tokens, wrt), _norm(layer.attn_norm, wrt),
              *_layer(layer.ff, tokens, wrt), *_layer(layer.ff_adapter, tokens, wrt),
              _norm(layer.ff_norm, wrt), *_layer(layer.memory, tokens, wrt)]
  return parts


def classifier_step_flops(model: SequenceClassifier, batch: int, seq_len: int, *,
                          wrt=nnx.Param) -> int:
  """Model FLOPs of a training step of `model` on `batch` sequences padded to `seq_len`
  (padding counted: the step computes it), training the parameters `wrt` selects: over a
  frozen backbone, the backward pass starts at the lowest trained part (`step_flops`). An LM
  backbone runs without XL memory; the head runs once per sequence (pooling not counted)."""
  if isinstance(model.backbone, Encoder):
    parts = _encoder_hidden(model.backbone, batch, seq_len, wrt)
  else:
    parts = _lm_hidden(model.backbone, batch, seq_len, 0, wrt)
  dense, out = model.head.dense, model.head.out_proj
  return step_flops([*parts,
                     Matmuls(batch * dense.in_features * dense.out_features, _trains(dense, wrt)),
                     Matmuls(batch * out.in_features * out.out_features, _trains(out, wrt))])


def _terraformer_stack(halves, d_model: int, batch: int, t: int, wrt) -> list[Matmuls]:
  """Reversible half-residuals on `batch` rows of `t` positions (recomputation not counted)."""
  parts = []
  for half in halves:
    parts.append(_norm(half.norm, wrt))
    if isinstance(half, AttentionHalf):
      parts += _self_attention(half.attn, d_model, batch, t, wrt)
    else:
      parts += _layer(half.ff, batch * t, wrt)
      if half.sru is not None:
        parts += [_norm(half.sru_norm, wrt), *_layer(half.sru, batch * t, wrt)]
  return parts


def terraformer_step_flops(model: Terraformer, batch: int, inputs_len: int, targets_len: int,
                           *, wrt=nnx.Param) -> int:
  """Model FLOPs of a training step of `model` on `batch` pairs padded to `inputs_len` and
  `targets_len` tokens: the encoder over the inputs, the decoder over their concatenation
  (`inputs_len + targets_len` positions), the output layer over the targets."""
  d, s, t = model.d_model, inputs_len, targets_len
  encoder_out = model.encoder_out
  join = [] if encoder_out is None else [  # None: `reversible_encoder`, no averaging join.
      Matmuls(batch * s * encoder_out.in_features * encoder_out.out_features,
              _trains(encoder_out, wrt)),
      _norm(model.encoder_norm, wrt)]
  return step_flops([
      Matmuls(0, _trains(model.embed, wrt)),
      *_terraformer_stack(model.encoder, d, batch, s, wrt),
      *join,
      *_terraformer_stack(model.decoder, d, batch, s + t, wrt),
      _norm(model.final_norm, wrt),
      _output_layer(model, batch * t, wrt)])
