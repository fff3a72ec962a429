"""The training loop: learning, exact resume after SIGTERM, NaN stop, evaluation."""

import json
import os

import jax
import numpy as np
import pytest
from flax import nnx
from training_testing import patch_step, sigterm_at, train_losses

from sparse_jax.tasks import train_and_evaluate
from sparse_jax.tasks.lm import build_model
from sparse_jax.tasks.runs import evaluate_checkpoint
from sparse_jax.training.checkpointing import Checkpointer, NoCheckpointError
from sparse_jax.training.loop import NonFiniteLossError
from sparse_jax.validation import ConfigError


def saved_params(workdir, config):
  model = build_model(config)
  checkpointer = Checkpointer(workdir)
  checkpointer.restore_params(checkpointer.latest_step(), model)
  checkpointer.close()
  return nnx.to_pure_dict(nnx.state(model, nnx.Param))


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
