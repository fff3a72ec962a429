"""The package as a user installs it: `python -m build` makes the sdist and the wheel, the wheel
goes into a fresh virtual environment (its dependencies from the package index, through pip's
cache), and from a directory outside the checkout the installed programs train the packaged
default for a few steps, evaluate the run, print a paper config's parameters, and Python loads
the run and generates from it. Slow (tests/conftest.py SLOW_TESTS): the build and the install
take a few minutes."""

import os
import subprocess
import sys
import tarfile
import zipfile

import sparse_jax

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The default config made tiny: two steps, one checkpoint, a short evaluation.
TINY = ["--config.data.batch_size=2", "--config.data.seq_len=16", "--config.model.d_model=16",
        "--config.model.n_layers=1", "--config.model.n_heads=2", "--config.model.mem_len=16",
        "--config.model.ff.n_experts=4", "--config.model.ff.expert_size=8",
        "--config.train.steps=2", "--config.train.warmup_steps=1", "--config.train.log_every=1",
        "--config.train.ckpt_every=2", "--config.eval.batch_size=2", "--config.eval.mem_len=16",
        "--config.eval.max_batches=2", "--config.mesh.data=1"]
LOAD_AND_GENERATE = """
import importlib.metadata, sys
import jax.numpy as jnp
import sparse_jax
from sparse_jax.aot import targets
model, config = sparse_jax.load("run")
print("h100 target", "h100" in targets.known_targets())  # read from the packaged targets.toml
tokens = sparse_jax.generate(model, jnp.array([list(b"def ")]), 5)
print("file", sparse_jax.__file__)
print("version", sparse_jax.__version__, importlib.metadata.version("sparse_jax"))
print("generated", tokens.shape, config.model.d_model)
"""


def run(command: list[str], cwd, env=None) -> subprocess.CompletedProcess:
  result = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=1200)
  assert result.returncode == 0, f"{command}:\n{result.stdout[-2000:]}\n{result.stderr[-3000:]}"
  return result


def build(out) -> dict:
  """The sdist and wheel `python -m build` makes of the checkout (once: it writes in the
  checkout, so two builds must not run at the same time)."""
  run([sys.executable, "-m", "build", "--outdir", str(out), REPO], cwd=REPO)
  version = sparse_jax.__version__
  return {"sdist": out / f"sparse_jax-{version}.tar.gz",
          "wheel": out / f"sparse_jax-{version}-py3-none-any.whl"}


def check_contents(dist: dict) -> None:
  """The wheel and sdist hold the configs, the programs, package data and the licence."""
  wheel = zipfile.ZipFile(dist["wheel"]).namelist()
  for name in ("sparse_jax/configs/default.py", "sparse_jax/configs/sigma_moe_paper.py",
               "sparse_jax/cli/train.py", "sparse_jax/__main__.py",
               "sparse_jax/aot/targets.toml", "pallas_kernels/cvmm.py"):
    assert name in wheel, name
  info = f"sparse_jax-{sparse_jax.__version__}.dist-info"
  assert f"{info}/licenses/LICENSE" in wheel
  entry_points = zipfile.ZipFile(dist["wheel"]).read(f"{info}/entry_points.txt").decode()
  assert "sparse-jax = sparse_jax.cli.main:main" in entry_points
  metadata = zipfile.ZipFile(dist["wheel"]).read(f"{info}/METADATA").decode()
  assert "License-Expression: Apache-2.0" in metadata
  assert f"Version: {sparse_jax.__version__}" in metadata
  sdist = tarfile.open(dist["sdist"]).getnames()
  root = f"sparse_jax-{sparse_jax.__version__}"
  assert {f"{root}/LICENSE", f"{root}/pyproject.toml", f"{root}/sparse_jax/configs/glue.py",
          f"{root}/sparse_jax/aot/targets.toml"} <= set(sdist)


def test_the_built_wheel_installs_and_trains_evaluates_loads_and_prints_params(stdlib_slice,
                                                                              tmp_path):
  dist = build(tmp_path / "dist")
  check_contents(dist)
  venv = tmp_path / "venv"
  run([sys.executable, "-m", "venv", str(venv)], cwd=tmp_path)
  run([str(venv / "bin" / "pip"), "install", "--quiet", str(dist["wheel"])], cwd=tmp_path)
  user = tmp_path / "user"  # Outside the checkout: only the installed package is importable.
  user.mkdir()
  env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
  env.update(JAX_PLATFORMS="cpu", PATH=f"{venv / 'bin'}:{env['PATH']}")
  data = [f"--config.data.source_root={stdlib_slice}",
          f"--config.data.data_dir={tmp_path / 'tfds'}",
          f"--compilation_cache={tmp_path / 'cache'}"]
  trained = run(["sparse-jax", "train", "--workdir=run", *data, *TINY], cwd=user, env=env)
  assert "final (run)" in trained.stdout and "bits_per_byte" in trained.stdout
  evaluated = run(["sparse-jax", "eval", "--workdir=run", "--max_batches=2",
                   f"--compilation_cache={tmp_path / 'cache'}"], cwd=user, env=env)
  assert "bits_per_byte=" in evaluated.stdout and (user / "run" / "eval_validation_2.json").exists()
  loaded = run([str(venv / "bin" / "python"), "-c", LOAD_AND_GENERATE], cwd=user, env=env)
  assert f"file {venv}" in loaded.stdout  # the installed copy, not the checkout
  version = sparse_jax.__version__
  assert f"version {version} {version}" in loaded.stdout
  assert "generated (1, 9) 16" in loaded.stdout
  assert "h100 target True" in loaded.stdout
  printed = run([str(venv / "bin" / "python"), "-m", "sparse_jax", "train",
                 "--config=sigma_moe_paper:wt103_s", "--print_params"], cwd=user, env=env)
  assert "total_params:" in printed.stdout
  assert not (user / "runs").exists()  # `--print_params` writes nothing
