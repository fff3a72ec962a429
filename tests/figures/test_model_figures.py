"""The figures that run a restored model: active channels of `u` (sigma-MoE Fig. 1/3/4) and
expert usage and co-occurrence (Fig. 5), on tiny runs trained here.

Each figure's numbers are checked against an independent tap: pytest's `monkeypatch` wraps the
layer's `__call__` to keep its inputs / outputs, and the statistics are recomputed in numpy
(float64 matmuls for `u`, Python loops over tokens for co-occurrence).
"""

import itertools
import json

import numpy as np
import pytest
from lm_testing import tiny_lm_config

from sparse_jax.figures import channel_activity, expert_routing
from sparse_jax.layers.dense_ff import DenseFF
from sparse_jax.layers.routers.sigma import SigmaRouter
from sparse_jax.tasks import train_and_evaluate

MAX_BATCHES = 3


def _train(root, stdlib_slice, **ff):
  config = tiny_lm_config(stdlib_slice, str(root / "tfds"))
  config.train.update(steps=2, warmup_steps=1, ckpt_every=2, log_every=2)
  if ff:
    config.model.ff = ff
  train_and_evaluate(config, str(root / "run"))
  return str(root / "run"), config


@pytest.fixture(scope="module")
def dense_run(tmp_path_factory, stdlib_slice):
  return _train(tmp_path_factory.mktemp("dense"), stdlib_slice, kind="dense", d_ff=64)


@pytest.fixture(scope="module")
def moe_run(tmp_path_factory, stdlib_slice):
  return _train(tmp_path_factory.mktemp("moe"), stdlib_slice)  # sigma-MoE, 4 experts, K=2


def _is_png(path) -> bool:
  with open(path, "rb") as f:
    return f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_channel_activity_counts_the_nonzero_hidden_units(dense_run, tmp_path, monkeypatch):
  workdir, config = dense_run
  inputs = []  # (layer object id, x) in call order
  real_call = DenseFF.__call__

  def keep_inputs(self, x):
    inputs.append((id(self), np.asarray(x, np.float64), self))
    return real_call(self, x)

  with monkeypatch.context() as m:
    m.setattr(DenseFF, "__call__", keep_inputs)
    paths = channel_activity.make_channel_activity(
        workdir, str(tmp_path), splits=("validation",), max_batches=MAX_BATCHES)
  numbers = json.loads(open(paths["json"]).read())
  assert _is_png(paths["png"])

  per_layer = {}
  for layer_id, x, layer in inputs:
    w1, b1 = (np.asarray(p[...], np.float64) for p in (layer.w_up, layer.b_up))
    per_layer.setdefault(layer_id, []).append(np.count_nonzero(np.maximum(x @ w1 + b1, 0), -1))
  expected = [np.concatenate([c.reshape(-1) for c in counts]) for counts in per_layer.values()]
  n_tokens = MAX_BATCHES * config.eval.batch_size * config.data.seq_len
  assert numbers["tokens"] == n_tokens and numbers["d_ff"] == 64
  assert numbers["layers"] == ["blocks/0/ff", "blocks/1/ff"]
  assert all(len(e) == n_tokens for e in expected)
  # f32 (the model) vs f64 (here) can flip a pre-activation within ~1e-6 of zero: allow the
  # mean count to differ by 0.05 channel (a flip in one token of twenty).
  np.testing.assert_allclose(numbers["mean"], [e.mean() for e in expected], atol=0.05)
  np.testing.assert_allclose(numbers["std"], [e.std() for e in expected], atol=0.05)
  assert 0 < min(numbers["mean"]) and max(numbers["mean"]) <= 64


def test_expert_routing_usage_and_cooccurrence(moe_run, tmp_path, monkeypatch):
  workdir, config = moe_run
  selections = []  # per router call: (layer object id, sel [N, K])
  real_call = SigmaRouter.__call__

  def keep_selection(self, x, **kwargs):
    routing = real_call(self, x, **kwargs)
    selections.append((id(self), np.asarray(routing.sel_nk)))
    return routing

  with monkeypatch.context() as m:
    m.setattr(SigmaRouter, "__call__", keep_selection)
    paths = expert_routing.make_expert_routing(
        workdir, str(tmp_path), layer=1, splits=("validation",), max_batches=MAX_BATCHES)
  numbers = json.loads(open(paths["json"]).read())
  assert _is_png(paths["png"])

  n_experts = config.model.ff.n_experts
  by_layer = {}
  for layer_id, sel in selections:
    by_layer.setdefault(layer_id, []).append(sel)
  sels = [np.concatenate(s) for s in by_layer.values()]
  for usage, sel in zip(numbers["usage"], sels):
    expected = [sum(e in row for row in sel.tolist()) / len(sel) for e in range(n_experts)]
    np.testing.assert_allclose(usage, expected, rtol=1e-12)
    assert sum(usage) == pytest.approx(config.model.ff.k)  # sigmoid gates are never 0
  pairs = np.zeros((n_experts, n_experts))
  for row in sels[1].tolist():
    for i, j in itertools.permutations(set(row), 2):
      pairs[i, j] += 1
  rows = pairs.sum(1, keepdims=True)
  np.testing.assert_allclose(numbers["cooccurrence"], pairs / np.where(rows, rows, 1),
                             rtol=1e-12)


def test_figures_refuse_models_without_the_layer(dense_run, moe_run, tmp_path):
  with pytest.raises(ValueError, match="dense feed-forward model.*'sigma_moe'"):
    channel_activity.compute_channel_activity(moe_run[0], max_batches=1)
  with pytest.raises(ValueError, match="mixture-of-experts model.*'dense'"):
    expert_routing.compute_expert_routing(dense_run[0], max_batches=1)
  with pytest.raises(ValueError, match=r"layer must be in \[0, 1\]"):
    expert_routing.compute_expert_routing(moe_run[0], layer=2, max_batches=1)
