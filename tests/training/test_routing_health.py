"""Routing health: the per-layer statistics of a logging window against numpy and scipy on
crafted routing, the collapse warning (once per layer and statistic), and the fields in
`metrics.jsonl` and TensorBoard of a tiny MoE LM run."""

import glob
import json
import logging
import os
import struct

import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
import scipy.stats
from tensorboardX.proto import event_pb2
from training_testing import patch_step

from sparse_jax.configs import glue
from sparse_jax.tasks import task_for, train_and_evaluate
from sparse_jax.tasks.lm import build_model
from sparse_jax.training.loop import MetricsWindow
from sparse_jax.training.routing_health import RoutingHealth

E, TOKENS, STEPS = 8, 64, 5
STATS = ("usage_entropy", "dead_fraction", "top_share")


def routed_counts(rng, k: int, experts: list[int], first: int | None = None) -> np.ndarray:
  """`[E]` slots per expert of one step: each token picks `first` (if given) and k distinct
  experts in all from `experts`."""
  counts_e = np.zeros(E, np.int64)
  for _ in range(TOKENS):
    rest = [e for e in experts if e != first]
    picks = ([first] if first is not None else []) + list(
        rng.choice(rest, k - (first is not None), replace=False))
    counts_e[picks] += 1
  return counts_e


def crafted(case: str) -> np.ndarray:
  """`[STEPS, E]` slot counts per step of a routing case."""
  rng = np.random.default_rng(0)
  if case == "collapsed":  # top-1: every token to expert 3
    return np.tile(np.eye(E, dtype=np.int64)[3] * TOKENS, (STEPS, 1))
  if case == "balanced":
    return np.stack([routed_counts(rng, 2, list(range(E))) for _ in range(STEPS)])
  if case == "dead_experts":  # 5, 6, 7 never used; 4 only in the first step (not dead)
    return np.stack([routed_counts(rng, 2, list(range(5 if s == 0 else 4)))
                     for s in range(STEPS)])
  if case == "one_expert_in_every_token":  # top-2, expert 0 always one of the two
    return np.stack([routed_counts(rng, 2, list(range(E)), first=0) for _ in range(STEPS)])
  assert case == "over_capacity"  # top-1 with a quarter of the tokens dropped
  counts = np.stack([routed_counts(rng, 1, list(range(E))) for _ in range(STEPS)])
  return counts * 3 // 4


def window_of(counts_se: np.ndarray, layer: str = "layer0") -> MetricsWindow:
  """A metrics window of the per-step metrics a task's loss returns for `counts_se`."""
  window = MetricsWindow(0)
  for counts_e in counts_se:
    share_e = (counts_e / TOKENS).astype(np.float32)
    window.metrics.append({"loss": np.float32(1.0), f"routing/{layer}/token_share": share_e})
  return window


def reference(counts_se: np.ndarray) -> dict[str, float]:
  """The statistics from the window's summed counts (scipy's entropy in base E)."""
  total_e = counts_se.sum(axis=0)
  return {"usage_entropy": scipy.stats.entropy(total_e, base=E),
          "dead_fraction": np.mean(total_e == 0),
          "top_share": total_e.max() / (TOKENS * len(counts_se))}


@pytest.mark.parametrize("case", ["balanced", "dead_experts", "collapsed",
                                  "one_expert_in_every_token", "over_capacity"])
def test_window_statistics_match_numpy(case):
  counts_se = crafted(case)
  logged = RoutingHealth(warn=False)(STEPS, window_of(counts_se).flush(TOKENS, "rate"))
  assert "routing/layer0/token_share" not in logged
  want = reference(counts_se)
  for stat in STATS:
    assert logged[f"routing/layer0/{stat}"] == pytest.approx(want[stat], abs=1e-6), stat
  if case == "collapsed":
    assert [logged[f"routing/layer0/{s}"] for s in STATS] == [0.0, 7 / 8, 1.0]
  if case == "dead_experts":
    assert logged["routing/layer0/dead_fraction"] == 3 / 8


def warnings_of(caplog) -> list[str]:
  return [r.getMessage() for r in caplog.records
          if r.levelno == logging.WARNING and "Routing health" in r.getMessage()]


def test_a_collapse_warns_once_per_layer_and_statistic(caplog):
  health = RoutingHealth()
  collapsed, balanced = crafted("collapsed"), crafted("balanced")
  with caplog.at_level(logging.WARNING):
    for step in (20, 40, 60):
      window = MetricsWindow(step - STEPS)
      window.metrics = [{**a, **b} for a, b in zip(window_of(balanced, "layer0").metrics,
                                                   window_of(collapsed, "layer3").metrics)]
      health(step, window.flush(TOKENS, "rate"))
  got = warnings_of(caplog)
  assert len(got) == 2, got
  assert "layer3 has dead_fraction=0.875 at step 20, above 0.500" in got[0]
  assert "layer3 has top_share=1.000 at step 20, above 0.900" in got[1]


@pytest.mark.parametrize("share_e", [
    [0.55, 0.45, 0.5, 0.5],  # top-2 of 4, balanced
    [0.5, 0.5, 0.5, 0.5, 0, 0, 0, 0],  # half dead
    [0.65, 0.3, 0.2, 0.2, 0.2, 0.15, 0.15, 0.15]])  # a busy expert, as the default has
def test_healthy_or_borderline_routing_does_not_warn(share_e, caplog):
  with caplog.at_level(logging.WARNING):
    RoutingHealth()(10, {"routing/layer0/token_share": np.array(share_e)})
  assert not warnings_of(caplog)


def test_one_expert_in_every_token_warns_of_its_top_share_alone(caplog):
  with caplog.at_level(logging.WARNING):
    RoutingHealth()(10, window_of(crafted("one_expert_in_every_token")).flush(TOKENS, "r"))
  got = warnings_of(caplog)
  assert len(got) == 1 and "layer0 has top_share=1.000 at step 10" in got[0], got


def test_off_the_main_process_nothing_is_logged(caplog):
  with caplog.at_level(logging.WARNING):
    RoutingHealth(warn=False)(10, {"routing/layer0/token_share": np.eye(E)[0]})
  assert not warnings_of(caplog)


FF_KINDS = {
    "sigma_moe": {},
    "switch": {"kind": "switch", "n_experts": 4, "expert_size": 16, "reg_coef": 0.01,
               "capacity_factor": 1.0},
    "sbase": {"kind": "sbase", "n_experts": 4, "expert_size": 16, "k": 2, "reg_coef": 0.0},
    "dense": {"kind": "dense", "d_ff": 32}}
KIND_KEYS = {"sigma_moe": {"token_share"}, "switch": {"token_share", "dropped_fraction"},
             "sbase": {"token_share", "rerouted_fraction"}, "dense": set()}


@pytest.mark.parametrize("kind", sorted(FF_KINDS))
def test_the_lm_tasks_step_metrics_carry_each_moe_layers_routing(tiny_config, kind):
  if FF_KINDS[kind]:
    tiny_config.model.ff = ml_collections.ConfigDict(FF_KINDS[kind])
  task, model = task_for(tiny_config), build_model(tiny_config)
  tokens_bt = jnp.arange(64, dtype=jnp.int32).reshape(4, 16) % 256
  _, (metrics, _) = task.loss(model, {"inputs": tokens_bt, "targets": tokens_bt},
                              model.init_memory(4))
  routing = {name for name in metrics if name.startswith("routing/")}
  assert routing == {f"routing/layer{i}/{key}" for i in (0, 1) for key in KIND_KEYS[kind]}
  for i in (0, 1):
    if kind != "dense":
      assert float(metrics[f"routing/layer{i}/token_share"].sum()) == pytest.approx(
          1 if kind == "switch" else 2, abs=0.3)


def test_the_classification_tasks_step_metrics_carry_the_routing():
  """With an MoE backbone (`lm_checkpoint` of a sigma-MoE LM) the classifier's aux holds its
  layers' routing; a stand-in model returns such an aux."""
  config = glue.get_config("rte,head")
  config.mesh.data = 1
  share_e = jnp.array([0.5, 0.5, 1.0, 0.0])

  def model(tokens, lengths):
    del tokens, lengths
    return jnp.zeros((2, 2)), {"reg_loss": jnp.zeros(()), "layer1/token_share": share_e,
                               "layer1/expert_usage": jnp.array([1, 1, 2, 0])}

  _, (metrics, _) = task_for(config).loss(model, {"tokens": None, "lengths": None,
                                                  "labels": jnp.array([0, 1])}, None)
  assert set(metrics) == {"task_loss", "routing/layer1/token_share"}


def tensorboard_tags(workdir: str) -> set[str]:
  """The scalar tags of the run's TensorBoard event files (TFRecord framing read by hand)."""
  tags = set()
  for path in glob.glob(os.path.join(workdir, "tensorboard", "events.*")):
    data, at = open(path, "rb").read(), 0
    while at < len(data):
      (length,) = struct.unpack("<Q", data[at:at + 8])
      event = event_pb2.Event.FromString(data[at + 12:at + 12 + length])
      tags.update(value.tag for value in event.summary.value)
      at += 12 + length + 4
  return tags


def test_a_tiny_moe_run_logs_routing_health_and_warns_once_on_a_collapse(
    tiny_config, tmp_path, monkeypatch, caplog):
  """Layer 1's token shares are replaced by a collapse onto two of its 8 experts: every
  window shows it, and each of its two statistics warns once, in the first window."""
  tiny_config.model.ff.n_experts = 8
  tiny_config.train.update(log_every=2, ckpt_every=6)
  collapsed_e = jnp.array([1.0, 1.0, 0, 0, 0, 0, 0, 0])

  def collapse_layer1(step_index, outputs):
    state, carry, metrics = outputs
    return state, carry, dict(metrics, **{"routing/layer1/token_share": collapsed_e})

  patch_step(monkeypatch, collapse_layer1)
  workdir = str(tmp_path / "run")
  with caplog.at_level(logging.WARNING):
    train_and_evaluate(tiny_config, workdir)
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    lines = [r for r in map(json.loads, f) if r["split"] == "train"]
  assert [r["step"] for r in lines] == [2, 4, 6]
  names = {f"routing/layer{i}/{stat}" for i in (0, 1) for stat in STATS}
  for r in lines:
    assert names <= set(r) and not any(k.endswith("token_share") for k in r)
    assert 0 < r["routing/layer0/usage_entropy"] <= 1
    assert r["routing/layer0/dead_fraction"] < 0.5
    assert (r["routing/layer1/dead_fraction"], r["routing/layer1/top_share"]) == (0.75, 1.0)
  assert {f"train/{name}" for name in names} <= tensorboard_tags(workdir)
  got = [w for w in warnings_of(caplog) if "layer1" in w]
  assert len(got) == 2 and all("at step 2" in w for w in got), got
