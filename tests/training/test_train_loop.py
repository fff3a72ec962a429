"""The training loop: learning, exact resume after SIGTERM, NaN stop, evaluation."""

import json
import os
import time

import jax
import numpy as np
import pytest
from training_testing import patch_step, saved_params, sigterm_at, train_losses

from sparse_jax.tasks import train_and_evaluate
from sparse_jax.tasks.lm import LanguageModelTask
from sparse_jax.tasks.runs import evaluate_checkpoint
from sparse_jax.training.checkpointing import Checkpointer, NoCheckpointError
from sparse_jax.training import loop
from sparse_jax.training.loop import NonFiniteLossError
from sparse_jax.training.metrics_log import latest_records, logged_seconds, read_metrics
from sparse_jax.validation import ConfigError


def test_a_few_dozen_steps_lower_the_loss(tiny_config, tmp_path):
  tiny_config.train.update(steps=40, warmup_steps=4, lr=3e-3, ckpt_every=40)
  final = train_and_evaluate(tiny_config, str(tmp_path / "run"))
  losses = train_losses(tmp_path / "run")
  first, last = np.mean([losses[s] for s in range(1, 6)]), np.mean(
      [losses[s] for s in range(36, 41)])
  assert last < first - 1.0, (first, last)  # from ~ln(256) = 5.5 nats towards text entropy
  assert np.isfinite(final["bits_per_byte"]) and final["step"] == 40


@pytest.mark.parametrize("accum", [1, 2])
def test_resume_after_sigterm_is_exact(tiny_config, tmp_path, monkeypatch, accum):
  tiny_config.train.grad_accum_steps = accum
  straight, resumed = str(tmp_path / "straight"), str(tmp_path / "resumed")
  train_and_evaluate(tiny_config, straight)

  with monkeypatch.context() as m:
    patch_step(m, sigterm_at(2))
    interrupted = train_and_evaluate(tiny_config, resumed)
  assert interrupted == {"step": 3, "interrupted": 1.0}
  assert Checkpointer(resumed).latest_step() == 3
  train_and_evaluate(tiny_config, resumed)

  assert train_losses(resumed) == train_losses(straight)
  assert sorted(train_losses(straight)) == list(range(1, 7))
  jax.tree.map(np.testing.assert_array_equal, saved_params(resumed, tiny_config),
               saved_params(straight, tiny_config))


def test_an_unrolled_run_resumes_with_its_layers_scanned(tiny_config, tmp_path, monkeypatch):
  """`model.scan_layers` changes the program, not the parameters or their checkpoint: a run
  stopped unrolled goes on scanned, and trains as the unrolled run does (to float32 rounding:
  another program)."""
  straight, resumed = str(tmp_path / "straight"), str(tmp_path / "resumed")
  train_and_evaluate(tiny_config, straight)
  with monkeypatch.context() as m:
    patch_step(m, sigterm_at(2))
    train_and_evaluate(tiny_config, resumed)
  tiny_config.model.scan_layers = True
  train_and_evaluate(tiny_config, resumed)

  expected, got = train_losses(straight), train_losses(resumed)
  assert sorted(got) == sorted(expected) == list(range(1, 7))
  np.testing.assert_allclose([got[s] for s in range(1, 7)], [expected[s] for s in range(1, 7)],
                             rtol=1e-5)
  jax.tree.map(lambda g, e: np.testing.assert_allclose(g, e, rtol=1e-4, atol=1e-6),
               saved_params(resumed, tiny_config), saved_params(straight, tiny_config))


class FakeClock:
  """Seconds that pass only when the test advances them (in place of `loop.clock`)."""

  def __init__(self):
    self.now = 0.0

  def __call__(self) -> float:
    return self.now

  def advance(self, seconds: float) -> None:
    self.now += seconds


def test_logged_times_leave_evaluation_out_of_the_rate_and_sum_over_resumes(
    tiny_config, tmp_path, monkeypatch):
  """On a fake clock each training step takes 1 s, compiling the step 10 s and each
  evaluation 100 s: each train line (a window of two steps) logs exactly 2 s and its rate from
  them; each invocation logs its compilation once; each evaluation logs its 100 s; and the
  logged parts add up to all the time that passed over both invocations."""
  step_s, compile_s, eval_s = 1.0, 10.0, 100.0
  tiny_config.train.update(steps=6, log_every=2, eval_every=2, ckpt_every=2)
  clock = FakeClock()
  monkeypatch.setattr(loop, "clock", clock)
  real_evaluate, real_compile = LanguageModelTask.evaluate, loop.Run._compile_step

  def evaluate(self, model, placement):
    clock.advance(eval_s)
    return real_evaluate(self, model, placement)

  def compile_step(self, batch, step):
    clock.advance(compile_s)
    return real_compile(self, batch, step)

  monkeypatch.setattr(LanguageModelTask, "evaluate", evaluate)
  monkeypatch.setattr(loop.Run, "_compile_step", compile_step)
  stop_after_step_4 = sigterm_at(3)  # Index 3 runs in the first invocation only.

  def timed_step(step_index, outputs):
    clock.advance(step_s)
    return stop_after_step_4(step_index, outputs)

  patch_step(monkeypatch, timed_step)
  workdir = str(tmp_path / "run")
  assert train_and_evaluate(tiny_config, workdir)["step"] == 4
  train_and_evaluate(tiny_config, workdir)

  records = read_metrics(workdir)
  train = latest_records(records, "train")
  tokens_per_step = tiny_config.data.batch_size * tiny_config.data.seq_len
  assert [r["step"] for r in train] == [2, 4, 6]
  for record in train:
    assert record["train_seconds"] == 2 * step_s, record
    assert record["tokens_per_second"] == pytest.approx(2 * tokens_per_step / (2 * step_s))
  assert {r["step"]: r["compile_seconds"] for r in train if "compile_seconds" in r} == {
      2: compile_s, 6: compile_s}  # one per invocation
  evals = latest_records(records, "validation")
  assert [(r["step"], r["eval_seconds"]) for r in evals] == [(2, eval_s), (4, eval_s),
                                                             (6, eval_s)]
  assert logged_seconds(records, tokens_per_step) == {
      "train": 6 * step_s, "eval": 3 * eval_s, "compile": 2 * compile_s, "total": clock.now}


def test_at_most_one_step_runs_ahead_of_the_host(tiny_config, tmp_path, monkeypatch):
  """Each step's loss is made to take 0.2 s on the device (a host callback). When step j is
  dispatched, step j - 2 has finished: the loop does not queue steps ahead of the device."""
  tiny_config.train.update(steps=6, log_every=6, ckpt_every=6)

  def slow(x):
    time.sleep(0.2)
    return x

  slow_loss = jax.jit(lambda x: jax.pure_callback(slow, jax.ShapeDtypeStruct(x.shape, x.dtype), x))
  losses, finished = {}, {}

  def after_step(step_index, outputs):
    state, carry, metrics = outputs
    if step_index >= 2:
      finished[step_index - 2] = losses[step_index - 2].is_ready()
    losses[step_index] = slow_loss(metrics["loss"])
    return state, carry, dict(metrics, loss=losses[step_index])

  patch_step(monkeypatch, after_step)
  train_and_evaluate(tiny_config, str(tmp_path / "run"))
  assert finished == {i: True for i in range(4)}


def test_nonfinite_loss_stops_and_keeps_last_good_checkpoint(tiny_config, tmp_path,
                                                             monkeypatch):
  tiny_config.train.update(steps=6, ckpt_every=2, log_every=2)

  def poison_step_4(step_index, outputs):
    state, memory, metrics = outputs
    if step_index == 3:
      metrics = dict(metrics, loss=metrics["loss"] * np.nan)
    return state, memory, metrics

  patch_step(monkeypatch, poison_step_4)
  workdir = str(tmp_path / "nan")
  with pytest.raises(NonFiniteLossError, match="at step 4"):
    train_and_evaluate(tiny_config, workdir)
  assert Checkpointer(workdir).all_steps() == [2]


def test_evaluation_of_a_checkpoint_is_finite_and_repeatable(tiny_config, tmp_path):
  workdir = str(tmp_path / "run")
  train_and_evaluate(tiny_config, workdir)
  first, path = evaluate_checkpoint(workdir, split="test")
  second, _ = evaluate_checkpoint(workdir, split="test")
  assert first == second
  assert first["step"] == 6 and first["mem_len"] == tiny_config.eval.mem_len
  assert np.isfinite(first["loss"]) and first["tokens"] > 0
  assert first["bits_per_byte"] == pytest.approx(first["loss"] / np.log(2))
  with open(path) as f:
    assert json.load(f) == first
  with pytest.raises(NoCheckpointError, match="step 5"):
    evaluate_checkpoint(workdir, step=5)


def test_eval_on_empty_workdir_says_no_checkpoint(tmp_path):
  with pytest.raises(NoCheckpointError, match="no checkpoint"):
    evaluate_checkpoint(str(tmp_path / "empty"))


@pytest.mark.parametrize("section,field,value", [
    ("train", "warmup_steps", 10),
    ("train", "lr", -1.0),
    ("data", "name", "enwik9"),
    ("data", "batch_size", 0),
    ("model", "vocab_size", 100),
    ("eval", "max_batches", 0),
])
def test_bad_experiment_configs_fail_before_training(tiny_config, tmp_path, section, field,
                                                     value):
  tiny_config[section][field] = value
  with pytest.raises(ConfigError, match=rf"{section}\.{field}"):
    train_and_evaluate(tiny_config, str(tmp_path / "bad"))
  assert not os.path.exists(tmp_path / "bad")
