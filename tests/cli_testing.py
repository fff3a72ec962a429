"""`train.py` and `eval.py` as the tests run them: as a user types them (a subprocess), or
their flags parsed exactly as `train.py` parses them, for a run in the test's own process
(which compiles into the session's cache for the subprocesses to reuse)."""

import os
import subprocess
import sys

import jax
import ml_collections
from absl import flags
from ml_collections import config_flags

from sparse_jax.cli import config_names
from sparse_jax.config_overrides import switch_kinds

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Flags for in-process runs that a subprocess with `session_devices` reuses: the test session
# simulates eight CPU devices (conftest), and these runs use one of them.
ONE_DEVICE = ["--config.mesh.data=1"]


def run_script(script: str, *args: str, session_devices: bool = False
               ) -> subprocess.CompletedProcess:
  """Runs `python script args` in the repository on CPU, with the session's compilation cache
  and optimisation setting (conftest, inherited through the environment). `session_devices`:
  also the session's simulated device count, which is part of a compilation's cache key, so
  the script reuses what the test compiled in-process (pass `ONE_DEVICE` to both)."""
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  if session_devices:
    env["JAX_NUM_CPU_DEVICES"] = str(jax.config.jax_num_cpu_devices)
  return subprocess.run([sys.executable, script, *args], cwd=REPO, env=env,
                        capture_output=True, text=True, timeout=600)


def cli_config(*args: str) -> ml_collections.ConfigDict:
  """The config `train.py` trains for these flags (`--config=FILE[:STRING]` and
  `--config.x.y=v` overrides), parsed by the same absl config flag and `switch_kinds`."""
  flag_values = flags.FlagValues()
  cwd = os.getcwd()
  os.chdir(REPO)  # Config files are named relative to the repository, as a user types them.
  try:
    argv = config_names.resolve_argv(["train.py", *args])
    config_flag = config_flags.DEFINE_config_file(
        "config", config_names.packaged_path("default"), flag_values=flag_values,
        lock_config=False,
        accept_new_attributes=True, sys_argv=argv)
    flag_values(argv)
  finally:
    os.chdir(cwd)
  return switch_kinds(config_flag.value,
                      config_flags.get_override_values(flag_values["config"]))
