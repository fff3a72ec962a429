"""Parameter and FLOP accounting for parameter-matched comparisons (sigma-MoE Table 3/4).

Layers are built abstractly (`nnx.eval_shape`), so counting a 262M-parameter config
allocates nothing.
"""

import copy
import dataclasses

import ml_collections
from flax import nnx

from sparse_jax.layers.counting import count_params
from sparse_jax.layers.registry import build_ff, parse_ff
from sparse_jax.models.blocks import build_attention
from sparse_jax.models.lm import ModelConfig, TransformerLM, validate_model_config


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
