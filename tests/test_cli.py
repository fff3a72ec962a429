"""train.py and eval.py as a user runs them: flags, config overrides, outputs, errors.
(train.py's training runs from the command line are in test_cli_recipes.py.)"""

import json
import os

from cli_testing import ONE_DEVICE, cli_config, run_script

from sparse_jax.tasks import train_and_evaluate


def run(args):
  return run_script(*args, session_devices=True)


def test_train_then_eval_from_the_command_line(stdlib_slice, tmp_path):
  """Trains in-process for train.py's flags (its command-line runs are test_cli_recipes.py's),
  then evaluates the checkpoint with eval.py as a user runs it: on the train split here (the
  test split is test_train_loop.py's, in-process)."""
  workdir = str(tmp_path / "run")
  overrides = [
      f"--config.data.source_root={stdlib_slice}", f"--config.data.data_dir={tmp_path / 'tfds'}",
      "--config.data.batch_size=2", "--config.data.seq_len=16", "--config.model.d_model=16",
      "--config.model.n_layers=1", "--config.model.n_heads=2", "--config.model.mem_len=16",
      "--config.model.ff.n_experts=4", "--config.model.ff.expert_size=8",
      "--config.train.steps=4", "--config.train.warmup_steps=1",
      "--config.train.log_every=2", "--config.train.ckpt_every=4", "--config.eval.batch_size=2",
      "--config.eval.mem_len=32", "--config.eval.max_batches=2", *ONE_DEVICE]
  trained = train_and_evaluate(cli_config("--config=default", *overrides), workdir)
  assert trained["step"] == 4 and trained["bits_per_byte"] > 0
  cache = tmp_path / "compilation_cache"
  evaluated = run(["eval.py", f"--workdir={workdir}", "--split=train", "--max_batches=3",
                   f"--compilation_cache={cache}"])
  assert evaluated.returncode == 0, evaluated.stderr[-3000:]
  assert any(cache.iterdir())  # the evaluation step, compiled once, kept for the next run
  with open(os.path.join(workdir, "eval_train_4.json")) as f:
    results = json.load(f)
  assert results["step"] == 4 and results["tokens"] == 3 * 2 * 16
  assert f"bits_per_byte={results['bits_per_byte']:.6g}" in evaluated.stdout


def test_eval_on_an_empty_workdir_says_so(tmp_path):
  """One line naming the directory and what to do; nothing created there."""
  result = run(["eval.py", f"--workdir={tmp_path}"])
  assert result.returncode != 0
  assert result.stderr.startswith("eval.py: no checkpoint in") and "train.py" in result.stderr
  assert len(result.stderr.strip().splitlines()) == 1, result.stderr
  assert os.listdir(tmp_path) == []


def test_train_rejects_a_bad_override_naming_the_field(tmp_path):
  result = run(["train.py", f"--workdir={tmp_path}", "--config.model.d_model=250"])
  assert result.returncode != 0
  assert "model.d_model" in result.stderr and "divisible by model.n_heads" in result.stderr
  assert "Traceback" not in result.stderr


def test_training_on_text_files_needs_them_inspecting_does_not(tmp_path):
  """A `text_files` config without its files: training stops naming the fields to set, before
  anything is written; `--print_params` (it reads no data) prints the counts."""
  config = "--config=moeut_paper:44m,moeut"
  result = run(["train.py", config, f"--workdir={tmp_path / 'run'}"])
  assert result.returncode != 0
  assert result.stderr.startswith("train.py: config field 'data.train_file' must be set")
  assert "data.file" in result.stderr and "Traceback" not in result.stderr
  assert not os.path.exists(tmp_path / "run")
  printed = run(["train.py", config, "--print_params"])
  assert printed.returncode == 0, printed.stderr[-3000:]
  assert "total_params:" in printed.stdout
