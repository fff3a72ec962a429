"""The seq2seq task: a Terraformer config trains, resumes through `train.py`, and a saved
checkpoint scores a split by greedy decoding (what `eval.py` runs); bad configs name the field
before anything is built."""

import json
import os
import subprocess

import numpy as np
import pytest
from cli_testing import ONE_DEVICE, cli_config, run_script
from training_testing import patch_step, sigterm_at

import sparse_jax
from sparse_jax.configs import terraformer_arithmetic
from sparse_jax.data import arithmetic
from sparse_jax.tasks import Seq2SeqTask, task_class, train_and_evaluate, validate_config
from sparse_jax.tasks.runs import (RunInterrupted, evaluate_checkpoint, saved_config,
                                  train_to_completion)
from sparse_jax.training.resume_config import FIELDS_ADDED_LATER
from sparse_jax.training.task import Task
from sparse_jax.validation import ConfigError

TINY = ["--config=terraformer_arithmetic:add", "--config.model.d_model=32",
        "--config.model.n_heads=2", "--config.model.n_encoder_layers=1",
        "--config.model.n_decoder_layers=1", "--config.model.ff.d_ff=64",
        "--config.model.lsh.chunk_len=8", "--config.model.lsh.n_buckets=4",
        "--config.data.batch_size=4", "--config.data.train_max_len=8",
        "--config.data.test_min_len=10", "--config.data.test_max_len=12",
        "--config.data.n_eval=8", "--config.eval.batch_size=4", "--config.eval.max_batches=1",
        "--config.eval.max_examples=4", "--config.train.log_every=1", *ONE_DEVICE]


def run(script: str, *args: str) -> subprocess.CompletedProcess:
  """`script` run as a user runs it, reusing what the test compiled in-process."""
  result = run_script(script, *args, session_devices=True)
  assert result.returncode == 0, (result.stdout[-2000:], result.stderr[-4000:])
  return result


def test_train_resume_and_eval_on_the_long_test_split(tmp_path, monkeypatch):
  """The first two of three steps train in-process (compiling into the session's cache), then
  stop as on SIGTERM; `train.py` resumes from their checkpoint (reusing the compiled step);
  the checkpoint is evaluated as `eval.py` does."""
  workdir = str(tmp_path / "run")
  flags = [*TINY, "--config.train.steps=3"]
  with monkeypatch.context() as m:
    patch_step(m, sigterm_at(1))
    assert train_and_evaluate(cli_config(*flags), workdir)["step"] == 2
  result = run("train.py", f"--workdir={workdir}", *flags)
  assert "step=3" in result.stdout and "per_digit_accuracy=" in result.stdout
  with open(os.path.join(workdir, "metrics.jsonl"), encoding="utf-8") as f:
    train_lines = [r for r in map(json.loads, f) if r["split"] == "train"]
  assert [r["step"] for r in train_lines] == [1, 2, 3]  # The second run resumed after step 2.
  assert all(r["tflops_per_device"] > 0 for r in train_lines)  # training.mfu
  results, path = evaluate_checkpoint(workdir, split="test")
  assert path == os.path.join(workdir, "eval_test_3.json")
  with open(path, encoding="utf-8") as f:
    scores = json.load(f)
  assert scores == json.loads(json.dumps(results)) and scores["step"] == 3
  assert 0.0 <= scores["per_digit_accuracy"] <= 1.0 and np.isfinite(scores["ce"])
  assert "sequence_accuracy" in scores


def test_terraformer_configs_pick_the_seq2seq_task():
  config = terraformer_arithmetic.get_config("copy,transformer")
  assert task_class(config) is Seq2SeqTask
  typed = validate_config(config)
  assert typed.model.reversible is False and typed.data.task == "copy"
  assert typed.model.vocab_size >= arithmetic.VOCAB_SIZE


@pytest.mark.parametrize("path,value,message", [
    ("data.task", "sort", "'data.task' must be one of"),
    ("data.test_max_len", 100, "'data.test_max_len' must be at least"),
    ("model.vocab_size", 8, "'model.vocab_size' must be >= the vocabulary"),
    ("model.lsh.n_buckets", 7, "'model.lsh.n_buckets' must be an even integer"),
    ("eval.batch_size", 0, "'eval.batch_size' must be a positive integer"),
])
def test_bad_fields_are_named(path, value, message):
  config = terraformer_arithmetic.get_config("copy")
  section, name = path.rsplit(".", 1)
  node = config
  for part in section.split("."):
    node = node[part]
  node[name] = value
  with pytest.raises(ConfigError, match=message):
    validate_config(config)


def test_bad_config_strings_are_refused():
  with pytest.raises(ValueError, match="expected one of"):
    terraformer_arithmetic.get_config("sort")


def test_a_checkpoint_saved_before_the_trax_options_rebuilds_its_model(tmp_path, monkeypatch):
  """A Terraformer saved before `model.positions` and the other Trax options existed (made
  here by the engine, its saved config stripped of them) loads with their values before
  (`resume_config.FIELDS_ADDED_LATER`), not today's defaults; resuming it with today's
  config is refused, naming the field."""
  before = FIELDS_ADDED_LATER[("model", "kind", "terraformer")]
  workdir = str(tmp_path / "run")
  flags = [*TINY, "--config.train.steps=1"]
  old = cli_config(*flags)
  old.model.update(before)
  resolved = Task.resolved_config

  def saved_without_the_new_fields(task):
    config = resolved(task)
    for name in before:
      del config.model[name]
    return config

  with monkeypatch.context() as m:
    m.setattr(Task, "resolved_config", saved_without_the_new_fields)
    train_and_evaluate(old, workdir)
  _, saved = saved_config(workdir)
  assert {name: saved.model[name] for name in before} == before
  model, _ = sparse_jax.load(workdir)
  assert model.encoder_positions is None and model.encoder_out is not None
  with pytest.raises(ConfigError, match="model.positions"):
    train_and_evaluate(cli_config(*TINY, "--config.train.steps=2"), workdir)


def test_train_to_completion_refuses_to_report_a_stopped_run(tmp_path, monkeypatch):
  """What benchmarks record: a run SIGTERM stops raises `RunInterrupted` (not its partial
  metrics); the same call again resumes it to the end."""
  workdir = str(tmp_path / "run")
  flags = [*TINY, "--config.train.steps=3"]
  with monkeypatch.context() as m:
    patch_step(m, sigterm_at(1))
    with pytest.raises(RunInterrupted, match="stopped at step 2"):
      train_to_completion(cli_config(*flags), workdir)
  assert train_to_completion(cli_config(*flags), workdir)["step"] == 3
