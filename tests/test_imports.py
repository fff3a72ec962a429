"""Modules that sit on both sides of the training <-> finetune layering import on their own.

`sparse_jax.finetune` builds on the engine's core (`training.checkpointing`, `training.steps`)
and the classification task builds on `finetune`; importing any of them first, in a fresh
interpreter, must work (a cycle would show up as a partially initialised module).
"""

import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODULES = ("sparse_jax.finetune.backbones", "sparse_jax.finetune.methods",
           "sparse_jax.finetune.storage", "sparse_jax.training",
           "sparse_jax.training.tasks.classification", "sparse_jax.training.tasks.lm",
           "sparse_jax.training.loop", "sparse_jax.config_overrides")


def test_each_module_imports_first_in_a_fresh_interpreter():
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  processes = {m: subprocess.Popen([sys.executable, "-c", f"import {m}"], cwd=REPO, env=env,
                                   stderr=subprocess.PIPE, text=True) for m in MODULES}
  failures = {m: p.communicate(timeout=300)[1][-1500:] for m, p in processes.items()}
  assert {m: err for m, err in failures.items() if processes[m].returncode} == {}


def test_importing_the_package_and_configs_does_not_start_jax():
  """`jax.distributed.initialize` (train.py --num_processes) must run before the XLA backend
  starts, so no module may compute with JAX at import time (a module-level `jnp.zeros` broke
  multi-process training once)."""
  script = (
      "import importlib, pkgutil, sparse_jax, configs\n"
      "from jax._src import xla_bridge\n"
      "for package in (sparse_jax, configs):\n"
      "  for info in pkgutil.walk_packages(package.__path__, package.__name__ + '.'):\n"
      "    importlib.import_module(info.name)\n"
      "    assert not xla_bridge.backends_are_initialized(), info.name\n")
  result = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True,
                          text=True, env=dict(os.environ, JAX_PLATFORMS="cpu"), timeout=300)
  assert result.returncode == 0, result.stderr[-1500:]
