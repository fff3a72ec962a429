"""`sparse_jax/configs/terraformer_arxiv.py` trains (with train.py's flags) on a test-made archive in the
official format, and `eval.py` writes the ROUGE F1 of its greedy summaries."""

import json
import os

import pytest
from cli_testing import ONE_DEVICE, cli_config, run_script

from sparse_jax.configs import terraformer_arxiv
from sparse_jax.data import rouge_metrics
from sparse_jax.tasks import train_and_evaluate
from sparse_jax.tasks import Seq2SeqTask, task_class, validate_config
from tests import arxiv_testing

TINY = ["--config=terraformer_arxiv:small", "--config.model.d_model=32",
        "--config.model.n_heads=2", "--config.model.attention_sparsity=2",
        "--config.model.n_encoder_layers=1", "--config.model.n_decoder_layers=1",
        "--config.model.ff.d_ff=64", "--config.model.lsh.chunk_len=8",
        "--config.model.lsh.n_buckets=4", f"--config.data.vocab_size={arxiv_testing.VOCAB}",
        "--config.data.max_input_len=40", "--config.data.max_target_len=12",
        "--config.data.download=False", "--config.data.batch_size=2",
        "--config.eval.batch_size=2", "--config.eval.max_batches=1",
        "--config.eval.max_examples=2", "--config.train.log_every=1", "--config.train.steps=2",
        *ONE_DEVICE]


def test_train_then_eval_writes_rouge(tmp_path):
  """Trains in-process from the flags (compiling into the session's cache, which eval.py
  reuses); `eval.py` then scores the test split from the command line."""
  manual_dir = arxiv_testing.write_archive(arxiv_testing.random_papers(), tmp_path)
  data_dir = tmp_path / "tfds"
  arxiv_testing.prepare(data_dir, manual_dir)
  workdir = str(tmp_path / "run")
  data_flags = [f"--config.data.data_dir={data_dir}", f"--config.data.manual_dir={manual_dir}"]
  final = train_and_evaluate(cli_config(*TINY, *data_flags), workdir)
  assert final["step"] == 2 and all(0.0 <= final[t] <= 100.0 for t in rouge_metrics.ROUGE_TYPES)
  result = run_script("eval.py", f"--workdir={workdir}", "--split=test", session_devices=True)
  assert result.returncode == 0, result.stderr[-4000:]
  with open(os.path.join(workdir, "eval_test_2.json"), encoding="utf-8") as f:
    scores = json.load(f)
  for rouge_type in rouge_metrics.ROUGE_TYPES:
    assert 0.0 <= scores[rouge_type] <= 100.0 and f"{rouge_type}=" in result.stdout


@pytest.mark.parametrize("size", terraformer_arxiv.SIZES)
def test_arxiv_configs_are_valid_seq2seq_configs(size):
  config = terraformer_arxiv.get_config(size)
  assert task_class(config) is Seq2SeqTask
  typed = validate_config(config)
  assert typed.model.vocab_size == typed.data.vocab_size


def test_paper_config_is_the_800m_terraformer():
  typed = validate_config(terraformer_arxiv.get_config("paper"))
  model, data = typed.model, typed.data
  assert (model.d_model, model.n_heads, model.n_encoder_layers, model.n_decoder_layers) == (
      1024, 16, 24, 24)
  assert (model.ff.d_ff, model.ff.block_size, model.attention_sparsity,
          model.loss_sparsity, model.sru_units) == (6144, 64, 16, 4, 32)
  assert (model.lsh.n_hashes, model.lsh.n_buckets, model.lsh.chunk_len) == (2, 128, 128)
  assert (data.vocab_size, data.max_input_len, data.max_target_len) == (32_000, 15_359, 1023)


def test_bad_config_string_is_refused():
  with pytest.raises(ValueError, match="expected one of"):
    terraformer_arxiv.get_config("large")
