"""The seq2seq task: a Terraformer config trains through `train.py`, resumes, and `eval.py`
scores a split by greedy decoding; bad configs name the field before anything is built."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from configs import terraformer_arithmetic
from sparse_jax.data import arithmetic
from sparse_jax.training.tasks import Seq2SeqTask, task_class, validate_config
from sparse_jax.validation import ConfigError

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TINY = ["--config=configs/terraformer_arithmetic.py:add", "--config.model.d_model=32",
        "--config.model.n_heads=2", "--config.model.n_encoder_layers=1",
        "--config.model.n_decoder_layers=1", "--config.model.ff.d_ff=64",
        "--config.model.lsh.chunk_len=8", "--config.model.lsh.n_buckets=4",
        "--config.data.batch_size=4", "--config.data.train_max_len=8",
        "--config.data.test_min_len=10", "--config.data.test_max_len=12",
        "--config.data.n_eval=8", "--config.eval.batch_size=4", "--config.eval.max_batches=1",
        "--config.eval.max_examples=4", "--config.train.log_every=1"]


def run(script: str, *args: str) -> subprocess.CompletedProcess:
  """Runs `script` on CPU. It inherits the session's compilation cache (conftest), so a
  resumed run and eval.py reuse what the first run compiled."""
  env = dict(os.environ, JAX_PLATFORMS="cpu", JAX_DISABLE_MOST_OPTIMIZATIONS="true")
  result = subprocess.run([sys.executable, script, *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=600)
  assert result.returncode == 0, (result.stdout[-2000:], result.stderr[-4000:])
  return result


def test_train_resume_and_eval_on_the_long_test_split(tmp_path):
  workdir = str(tmp_path / "run")
  run("train.py", f"--workdir={workdir}", *TINY, "--config.train.steps=2")
  result = run("train.py", f"--workdir={workdir}", *TINY, "--config.train.steps=3")
  assert "step=3" in result.stdout and "per_digit_accuracy=" in result.stdout
  with open(os.path.join(workdir, "metrics.jsonl"), encoding="utf-8") as f:
    steps = [r["step"] for r in map(json.loads, f) if r["split"] == "train"]
  assert steps == [1, 2, 3]  # The second run resumed after step 2.
  result = run("eval.py", f"--workdir={workdir}", "--split=test")
  with open(os.path.join(workdir, "eval_test_3.json"), encoding="utf-8") as f:
    scores = json.load(f)
  assert 0.0 <= scores["per_digit_accuracy"] <= 1.0 and np.isfinite(scores["ce"])
  assert "sequence_accuracy" in scores and "per_digit_accuracy=" in result.stdout


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
