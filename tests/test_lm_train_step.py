"""benchmarks/lm_train_step.py: the timing benchmarks' training step and ABBA timing."""

import time

import jax
import numpy as np
import pytest

from benchmarks.lm_train_step import LMTrainStep, abba_step_times
from benchmarks.routing_health_cost import bench_config
from sparse_jax import parallel


def test_abba_order_compiles_each_step_first_then_alternates():
  calls = []
  steps = {name: (lambda batch, step, name=name: calls.append((name, batch, step)))
           for name in ("a", "b")}
  times = abba_step_times(steps, ["x", "y"], rounds=3)
  assert calls == [("a", "x", 0), ("b", "x", 0),  # compiling calls
                   ("a", "x", 1), ("b", "x", 1), ("b", "y", 2), ("a", "y", 2),
                   ("a", "x", 3), ("b", "x", 3)]
  assert {name: len(t) for name, t in times.items()} == {"a": 3, "b": 3}


def test_abba_settles_each_result_off_the_clock():
  settled = []

  def settle(result):
    settled.append(result)
    time.sleep(0.2)  # not counted in the call's time

  steps = {name: (lambda batch, step, name=name: (name, step)) for name in ("a", "b")}
  times = abba_step_times(steps, ["x"], rounds=2, settle=settle)
  assert settled == [("a", 0), ("b", 0), ("a", 1), ("b", 1), ("b", 2), ("a", 2)]
  assert max(max(t) for t in times.values()) < 0.2


def test_steps_train_their_own_state_from_the_same_seed():
  """Two steps built from one config start equal (same seed) and keep their own state: the
  one that trained 3 steps scores the shared batch lower than the fresh one."""
  config = bench_config("tiny")
  mesh = parallel.make_mesh([1, 1, 1])
  with jax.set_mesh(mesh):
    trained, fresh = LMTrainStep(config, mesh), LMTrainStep(config, mesh)
    batch = trained.random_batch(np.random.default_rng(0))
    tokens = np.asarray(batch["inputs"])
    assert tokens.shape == (config.data.batch_size, config.data.seq_len)
    np.testing.assert_array_equal(np.asarray(batch["targets"])[:, :-1], tokens[:, 1:])
    first = float(trained(batch, 0)["loss"])
    assert float(fresh(batch, 0)["loss"]) == first
    for step in (1, 2, 3):
      trained(batch, step)
    assert float(trained(batch, 4)["loss"]) < float(fresh(batch, 1)["loss"])


def test_run_keeps_one_step_in_flight_and_trains_as_single_steps_do():
  """`run` (steps dispatched as the training loop does) ends where as many waited-for steps
  end: the same last loss, and the same next one."""
  config = bench_config("tiny")
  mesh = parallel.make_mesh([1, 1, 1])
  with jax.set_mesh(mesh):
    piped, single = LMTrainStep(config, mesh), LMTrainStep(config, mesh)
    batch = piped.random_batch(np.random.default_rng(0))
    last = piped.run(batch, 0, 3)
    for step in range(3):
      want = single(batch, step)
    assert float(last["loss"]) == float(want["loss"])
    assert float(piped(batch, 3)["loss"]) == float(single(batch, 3)["loss"])
    with pytest.raises(ValueError, match="steps must be >= 1"):
      piped.run(batch, 4, 0)
