"""`--config`'s value (sparse_jax.cli.config_names): a packaged config by name, a file, or the
configs' old repository path; and the `sparse-jax` command that dispatches the programs."""

import os
import subprocess
import sys

import pytest

from sparse_jax.cli import config_names
from sparse_jax.cli.train import default_workdir

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGED = os.path.join(REPO, "sparse_jax", "configs")


@pytest.fixture(autouse=True)
def outside_the_checkout(tmp_path, monkeypatch):
  """Relative paths are read from an empty directory, as a user of the installed package
  types them."""
  monkeypatch.chdir(tmp_path)


def test_the_packaged_configs_are_those_with_get_config():
  names = config_names.packaged_names()
  assert {"default", "sigma_moe_paper", "glue", "moeut_small"} <= set(names)
  assert "paper_training" not in names and "finetune_common" not in names  # helpers
  assert "__init__" not in names


@pytest.mark.parametrize("value, name, arg", [
    ("sigma_moe_paper:wt103_s", "sigma_moe_paper", ":wt103_s"), ("default", "default", ""),
    ("glue:rte,houlsby", "glue", ":rte,houlsby"),
    ("configs/sigma_moe_paper.py:wt103_s", "sigma_moe_paper", ":wt103_s"),  # the old path
    ("./configs/default.py", "default", "")])
def test_names_and_old_paths_resolve_to_the_packaged_file(value, name, arg):
  assert config_names.resolve(value) == os.path.join(PACKAGED, f"{name}.py") + arg


def test_an_existing_file_is_loaded_as_given(tmp_path):
  (tmp_path / "configs").mkdir()
  (tmp_path / "configs" / "default.py").write_text("def get_config():\n  return None\n")
  for value in ("configs/default.py", "configs/default.py:x"):
    assert config_names.resolve(value) == value


@pytest.mark.parametrize("value", ["sigma_moe_papr:wt103_s", "configs/nope.py", "paper_training",
                                   "runs/x.py"])
def test_an_unknown_config_names_the_packaged_ones(value):
  with pytest.raises(config_names.UnknownConfigError) as error:
    config_names.resolve(value)
  message = str(error.value)
  assert f"--config={value}" in message and "sigma_moe_paper, spartan_stdlib" in message


def test_only_the_config_flag_is_resolved():
  argv = ["train.py", "--config", "glue:rte", "--config.train.steps=3", "--workdir=default"]
  assert config_names.resolve_argv(argv) == [
      "train.py", "--config", os.path.join(PACKAGED, "glue.py:rte"), "--config.train.steps=3",
      "--workdir=default"]
  assert config_names.resolve_argv(["t", "--config=default"]) == [
      "t", f"--config={os.path.join(PACKAGED, 'default.py')}"]


def test_short_names_and_workdirs_of_packaged_configs():
  resolved = config_names.resolve("sigma_moe_paper:wt103_s")
  assert config_names.short_name(resolved) == "sigma_moe_paper:wt103_s"
  assert config_names.short_name("mine/x.py:a") == "mine/x.py:a"
  assert default_workdir(config_names.resolve("default")) == "runs/default"
  assert default_workdir("configs/default.py") == "runs/default"


def sparse_jax_command(*args: str) -> subprocess.CompletedProcess:
  """`python -m sparse_jax args` from the test's empty directory, the checkout importable."""
  env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=REPO)
  return subprocess.run([sys.executable, "-m", "sparse_jax", *args], env=env,
                        capture_output=True, text=True, timeout=300)


def test_the_command_lists_its_programs_and_rejects_others():
  listed = sparse_jax_command("--help")
  assert listed.returncode == 0 and "train, eval, figures, glue-average" in listed.stdout
  wrong = sparse_jax_command("trian")
  assert wrong.returncode != 0
  assert wrong.stderr.startswith("sparse-jax: unknown command 'trian'")


def test_train_finds_its_default_config_from_any_directory():
  """(`--config=NAME` commands run as test_docstring_commands.py's `--print_params` checks.)"""
  printed = sparse_jax_command("train", "--print_params")
  assert printed.returncode == 0, printed.stderr[-3000:]
  assert "total_params:" in printed.stdout
  wrong = sparse_jax_command("train", "--config=moeut_smal:moeut", "--print_params")
  assert wrong.returncode != 0 and "'moeut_smal' is neither a file nor" in wrong.stderr
  assert "Traceback" not in wrong.stderr
