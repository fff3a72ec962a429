"""Routing health, live: per MoE layer, how evenly its router spreads tokens over experts.

A router's collapse (dead experts, one expert taking every token) is the most common MoE
training failure, so the training log shows it while it happens rather than after the fact
(`figures.expert_routing`). Nothing is routed twice: every MoE layer already returns, in its
aux (`layers.moe.MoE`), `token_share [E]`, the fraction of the step's tokens each expert
processes (the usage of `figures.expert_routing`; it sums to k when no slot is dropped), and
its router's own statistics (`Routing.stats`): Switch's `dropped_fraction` (tokens over
capacity, whose FF output is zero) and S-BASE's `rerouted_fraction` (slots that the balanced
assignment or expert dropout sent outside the token's own top-k by score).

A task passes these out of the jitted step as metrics (`step_metrics`). The training loop's
metrics window averages each over the steps since the last log (a vector elementwise), which
keeps what the statistics need: the mean of equal-sized steps' (or gradient-accumulation
micro-batches') shares is the window's share, and an expert's mean share is zero exactly when
it received no token in the window. `RoutingHealth` turns each layer's window share into
logged scalars (docs/training.md "Routing health"):

  routing/layer{i}/usage_entropy   entropy of the window's distribution of routed slots over
                                   the experts, divided by log E: 1 uniform, 0 one expert
  routing/layer{i}/dead_fraction   fraction of the experts that processed no token
  routing/layer{i}/top_share       the busiest expert's fraction of the tokens: k/E when
                                   uniform, 1 when it takes every token
  routing/layer{i}/dropped_fraction   Switch only (0 without a capacity factor)
  routing/layer{i}/rerouted_fraction  S-BASE only

SwitchHead attention (`model.attention="switchhead"`) adds `routing/layer{i}/attn_v/...` and
`routing/layer{i}/attn_o/...`, the same three statistics of its V and O routers, each the
worst of its heads (`layer_stats` of `[H, E]` shares).

and warns once per layer and statistic when `dead_fraction > DEAD_FRACTION_LIMIT` or
`top_share > max(TOP_SHARE_LIMIT, TOP_SHARE_OVER_UNIFORM * k/E)`.
"""

import jax
import jax.numpy as jnp
import numpy as np
from absl import logging

# The router's per-layer diagnostics that `step_metrics` passes out of the step.
STEP_KEYS = ("token_share", "dropped_fraction", "rerouted_fraction")
PREFIX = "routing/"

# More than half of a layer's experts idle for a whole logging window (tens of thousands of
# routed slots at the default sizes, so never by chance in a healthy layer): the layer has
# lost most of its capacity. Early collapse shows first as a few dead experts; half is the
# point where it is unambiguous.
DEAD_FRACTION_LIMIT = 0.5
# One expert in (nearly) every token: the collapse, whatever k. Lower shares are normal for
# top-k > 1 routers: the embedded default (k = 2 of 8) trains well with its last layer's
# busiest expert in 52-65% of the tokens over its first 100 steps, so a limit of 0.5 would
# warn on every default run. The limit is also at least twice the uniform share (k/E), so
# that configs with k/E > 0.45 (the tests' 2 of 4) never warn on balanced routing.
TOP_SHARE_LIMIT = 0.9
TOP_SHARE_OVER_UNIFORM = 2.0


def step_metrics(aux: dict[str, jax.Array]) -> dict[str, jax.Array]:
  """`routing/layer{i}/{key}` (float32) for each `layer{i}/{key}` of a model's aux with `key`
  in `STEP_KEYS`; empty for a model without MoE layers. Traced inside the training step."""
  return {PREFIX + name: value.astype(jnp.float32) for name, value in aux.items()
          if name.rpartition("/")[2] in STEP_KEYS}


def layer_stats(share_e: np.ndarray) -> dict[str, float]:
  """`usage_entropy`, `dead_fraction` and `top_share` of one layer's window token shares
  `[E]` (module docstring). Shares `[H, E]` (SwitchHead: one router per head) give the worst
  head's: the least entropy, the most dead experts, the largest top share."""
  share_e = np.asarray(share_e, np.float64)
  if share_e.ndim == 2:
    heads = [layer_stats(row_e) for row_e in share_e]
    return {"usage_entropy": min(h["usage_entropy"] for h in heads),
            "dead_fraction": max(h["dead_fraction"] for h in heads),
            "top_share": max(h["top_share"] for h in heads)}
  n_experts, total = share_e.shape[0], share_e.sum()
  p_e = share_e / total if total > 0 else np.zeros_like(share_e)
  used_p = p_e[p_e > 0]
  entropy = float(-np.sum(used_p * np.log(used_p)))
  return {"usage_entropy": entropy / np.log(n_experts) if n_experts > 1 else 1.0,
          "dead_fraction": float(np.mean(share_e == 0)),
          "top_share": float(share_e.max())}


def top_share_limit(share_e: np.ndarray) -> float:
  """The `top_share` above which a layer warns; the uniform share is the routed slots per
  token (k, less any dropped) over E (`[H, E]`: the largest head's)."""
  uniform = float(np.max(np.sum(share_e, axis=-1))) / np.shape(share_e)[-1]
  return max(TOP_SHARE_LIMIT, TOP_SHARE_OVER_UNIFORM * uniform)


class RoutingHealth:
  """The logged routing scalars of a window's mean metrics, and the collapse warnings.

  `health(step, metrics)` replaces each `routing/layer{i}/token_share` vector of `metrics`
  with that layer's `layer_stats` and, the first time a layer's `dead_fraction` or
  `top_share` crosses its threshold, logs a warning naming the layer, statistic, value and
  step (only with `warn`, i.e. on the main process). Other metrics pass through.
  """

  def __init__(self, *, warn: bool = True):
    self.warn, self.warned = warn, set()

  def __call__(self, step: int, metrics: dict) -> dict[str, float]:
    out = {}
    for name, value in metrics.items():
      prefix, _, key = name.rpartition("/")
      if not (name.startswith(PREFIX) and key == "token_share"):
        out[name] = value
        continue
      stats = layer_stats(value)
      out.update({f"{prefix}/{stat}": v for stat, v in stats.items()})
      limits = {"dead_fraction": DEAD_FRACTION_LIMIT, "top_share": top_share_limit(value)}
      self._check(step, prefix.removeprefix(PREFIX), stats, limits)
    return out

  def _check(self, step: int, layer: str, stats: dict[str, float],
             limits: dict[str, float]) -> None:
    for stat, limit in limits.items():
      if stats[stat] > limit and (layer, stat) not in self.warned:
        self.warned.add((layer, stat))
        if self.warn:
          logging.warning(
              "Routing health: %s has %s=%.3f at step %d, above %.3f; its router may be "
              "collapsing (docs/training.md \"Routing health\"). Warned once per layer and statistic.",
              layer, stat, stats[stat], step, limit)
