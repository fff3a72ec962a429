"""The docs' command-line recipes, run through `train.py` as a user types them (offline, tiny).

Each run shrinks what the recipe does not name (model size, steps, evaluation batches) with
more overrides, so it takes seconds; the overrides under test are exactly the docs'.
"""

import subprocess

import numpy as np
import pytest

from cli_testing import cli_config, run_script

from sparse_jax.tasks import task_for

TINY = ["--config.model.d_model=32", "--config.model.n_layers=1", "--config.model.n_heads=2",
        "--config.model.mem_len=16", "--config.data.batch_size=2", "--config.data.seq_len=16",
        "--config.train.steps=4", "--config.train.log_every=2", "--config.eval.batch_size=2",
        "--config.eval.max_batches=2"]


def train(*args: str) -> subprocess.CompletedProcess:
  return run_script("train.py", *args)


def succeeded(result: subprocess.CompletedProcess) -> bool:
  return result.returncode == 0 or print(result.stdout[-2000:], result.stderr[-4000:])


def failed_cleanly(result: subprocess.CompletedProcess) -> bool:
  return result.returncode != 0 and "Traceback" not in result.stderr


def user_text(n_lines: int, seed: int) -> str:
  rng = np.random.default_rng(seed)
  words = ["def", "return", "the", "value", "of", "x", "=", "1.5", "naïve", "→", "# note"]
  return "".join(" ".join(rng.choice(words, size=rng.integers(1, 12))) + "\n"
                 for _ in range(n_lines))


def test_the_default_config_runs_20_steps(stdlib_slice, tmp_path):
  """`python train.py --config.train.steps=20`: the warmup (10% of the steps) follows. The
  model is narrowed to keep the run short; the data and training sections are the default's."""
  result = train(f"--workdir={tmp_path / 'run'}", "--config.train.steps=20",
                 "--config.model.d_model=32", "--config.model.n_layers=1",
                 f"--config.data.source_root={stdlib_slice}",
                 f"--config.data.data_dir={tmp_path / 'tfds'}", "--config.eval.max_batches=1")
  assert succeeded(result)
  assert "step=20" in result.stdout and "bits_per_byte=" in result.stdout


def test_own_text_in_three_files(tmp_path):
  """docs/datasets.md "Your own text": `--config.data.name=text_files --config.data.train_file=...`."""
  for seed, split in enumerate(("train", "validation", "test")):
    (tmp_path / f"{split}.txt").write_text(user_text(300, seed), encoding="utf-8")
  result = train(f"--workdir={tmp_path / 'run'}", *TINY, "--config.data.name=text_files",
                 f"--config.data.train_file={tmp_path / 'train.txt'}",
                 f"--config.data.validation_file={tmp_path / 'validation.txt'}",
                 f"--config.data.test_file={tmp_path / 'test.txt'}",
                 f"--config.data.data_dir={tmp_path / 'tfds'}")
  assert succeeded(result) and "bits_per_byte=" in result.stdout


def test_own_text_in_one_file_with_sentencepiece(tmp_path):
  """`--config.data.file=all.txt --config.data.split_fractions="(0.9,0.05,0.05)"` with
  `--config.data.tokenizer=sentencepiece` (and data.sp_vocab_size, model.vocab_size)."""
  (tmp_path / "all.txt").write_text(user_text(3000, 0), encoding="utf-8")
  result = train(f"--workdir={tmp_path / 'run'}", *TINY, "--config.data.name=text_files",
                 f"--config.data.file={tmp_path / 'all.txt'}",
                 "--config.data.split_fractions=(0.9,0.05,0.05)",
                 "--config.data.tokenizer=sentencepiece", "--config.data.sp_vocab_size=330",
                 "--config.model.vocab_size=330", f"--config.data.data_dir={tmp_path / 'tfds'}")
  assert succeeded(result) and "perplexity=" in result.stdout


def test_switching_the_ff_kind_makes_its_fields_settable(stdlib_slice, tmp_path):
  result = train(f"--workdir={tmp_path / 'run'}", *TINY, "--config.model.ff.kind=dense",
                 "--config.model.ff.d_ff=64", f"--config.data.source_root={stdlib_slice}",
                 f"--config.data.data_dir={tmp_path / 'tfds'}")
  assert succeeded(result) and "bits_per_byte=" in result.stdout


def test_documented_overrides_print_params():
  """docs/sigma_moe.md "The paper's models" (`--config.model.ff.k=2
  --config.model.ff.reg_coef=0` on a variant) and README "Train" (d_model, seq_len, steps),
  without data or training. The first recipe runs as `train.py --print_params`; the others'
  flags are parsed as train.py parses them (`cli_config`) and reported as its `--print_params` reports, in-process."""
  result = train("--config=moe_variants:wt103_s,sigma_moe", "--config.model.ff.k=2",
                 "--config.model.ff.reg_coef=0", "--print_params")
  # WT-S: d_model 412, 16 experts of 128, now K=2, against the matched dense d_ff 2053.
  percent = 100 * (412 * 16 + 2 * 2 * 412 * 128) / (2 * 412 * 2053)
  assert succeeded(result) and f"ff_flops_percent_of_dense: {percent:,.3f}" in result.stdout
  assert "total_params: " in result.stdout
  for recipe in (["--config=default", "--config.train.steps=2000",
                  "--config.model.d_model=384", "--config.data.seq_len=256"],
                 ["--config=sigma_moe_paper:wt103_s", "--config.mesh.data=2",
                  "--config.mesh.fsdp=2", "--config.mesh.expert=2"],
                 ["--config=wt103_s_dense", "--config.data.source_dir=/wt103_raw"]):
    report = task_for(cli_config(*recipe)).param_report()  # What train.py --print_params prints.
    assert report["total_params"] > 0, recipe


def test_a_typo_names_the_nearest_field(tmp_path):
  result = train(f"--workdir={tmp_path / 'run'}", "--config.model.ff.n_expert=4")
  assert failed_cleanly(result)
  assert ("config field 'model.ff.n_expert' is unknown for model.ff.kind='sigma_moe'; did you "
          "mean 'n_experts'?") in result.stderr


@pytest.mark.parametrize("config", [[], ["--config=default"]])
def test_a_misspelt_section_names_the_nearest_one(tmp_path, config):
  result = train(f"--workdir={tmp_path / 'run'}", *config, "--config.trian.steps=3")
  assert failed_cleanly(result)
  assert "section the config does not have: 'trian'" in result.stderr
  assert 'Did you mean "train"' in result.stderr


def test_a_bad_ff_field_fails_before_the_dataset_is_prepared(tmp_path):
  data_dir = tmp_path / "tfds"
  result = train(f"--workdir={tmp_path / 'run'}", f"--config.data.data_dir={data_dir}",
                 "--config.model.ff.k=9")
  assert failed_cleanly(result)
  assert "config field 'model.ff.k' must be an integer in [1, model.ff.n_experts=8]" in (
      result.stderr)
  assert not data_dir.exists() and not (tmp_path / "run").exists()
