"""Train a sparse_jax model: a language model, or a classifier over a frozen backbone.

  sparse-jax train                         # the packaged default config into runs/default
  sparse-jax train --config=quality_small --workdir=runs/x --config.train.steps=100
  sparse-jax train --config=quality_small --print_params   # parameters, % FF FLOPs
  sparse-jax train --config.mesh.fsdp=2 --config.mesh.expert=4   # a device mesh
  sparse-jax train --coordinator_address=host0:1234 --num_processes=2 --process_id=0  # multi-host
  sparse-jax train --config=spartan_stdlib         # fine-tune a frozen backbone (SPARTAN)
  sparse-jax train --config=glue:rte,houlsby --config.backbone.path=roberta-base
  sparse-jax train --config=spartan_stdlib --seeds=0,1,2   # mean and std over seeds
  sparse-jax train --config=sigma_moe_paper:wt103_s_star --compile_only=h100

`--config=NAME[:ARG]` names a config of `sparse_jax/configs` (`sparse_jax.cli.config_names`),
`--config=FILE[:ARG]` a file; in a checkout, `python train.py` is the same program. Re-running
with the same workdir resumes from its latest checkpoint. `--print_params` and
`--compile_only` read no data, so they need none of the data's files or folders set.
"""

import atexit
import gc
import os
import sys

import jax
from absl import app, flags, logging
from ml_collections import config_flags

from sparse_jax import validation
from sparse_jax.aot import targets
from sparse_jax.cli import config_names
from sparse_jax.config_overrides import switch_kinds
from sparse_jax.data.sources import BadSourceError
from sparse_jax.tasks import task_for, train_and_evaluate
from sparse_jax.tasks.seed_runs import SUMMARY_FILE, run_seeds
from sparse_jax.training import compilation_cache, distributed
from sparse_jax.training.checkpointing import CheckpointRestoreError, CheckpointWriteError
from sparse_jax.training.compile_only import DoesNotFitError, compile_task
from sparse_jax.training.loop import NonFiniteLossError, format_metrics, run_task
from sparse_jax.validation import ConfigError


def _env_int(name: str) -> int | None:
  return int(os.environ[name]) if name in os.environ else None


def _unknown_section(error: Exception):
  """Exits naming an override inside a section the config lacks (`--config.trian.steps=3`),
  which ml_collections reports as a KeyError/AttributeError, instead of a traceback."""
  sys.exit(f"train.py: a --config override names a section the config does not have: "
           f"{error.args[0] if error.args else error}")


def _define_config_flag():
  """The `--config` flag. New attributes are accepted so that switching a kind
  (`--config.data.name=text_files`) can set the new kind's fields; `switch_kinds` drops the
  old kind's and the schemas reject typos. Without `--config`, absl parses the default file
  and its overrides right here."""
  try:
    return config_flags.DEFINE_config_file("config", config_names.packaged_path("default"),
                                           "Experiment config file (get_config()).",
                                           lock_config=False, accept_new_attributes=True)
  except (KeyError, AttributeError) as e:
    _unknown_section(e)


_CONFIG = _define_config_flag()
_WORKDIR = flags.DEFINE_string("workdir", None, "Run directory (default: runs/<config name>).")
_PRINT_PARAMS = flags.DEFINE_bool(
    "print_params", False, "Print the model's parameter and FF FLOP counts (fine-tuning: "
    "trainable parameters and storage per task), then exit. Reads no data.")
_COORDINATOR = flags.DEFINE_string(
    "coordinator_address", os.environ.get("JAX_COORDINATOR_ADDRESS"),
    "Multi-process job: host:port of process 0 (env JAX_COORDINATOR_ADDRESS).")
_NUM_PROCESSES = flags.DEFINE_integer(
    "num_processes", _env_int("JAX_NUM_PROCESSES"),
    "Multi-process job: number of processes (env JAX_NUM_PROCESSES).")
_PROCESS_ID = flags.DEFINE_integer(
    "process_id", _env_int("JAX_PROCESS_ID"),
    "Multi-process job: this process's index (env JAX_PROCESS_ID).")
_SEEDS = flags.DEFINE_list(
    "seeds", None, "Train once per seed (comma-separated integers) in WORKDIR/seed_<s> and "
    f"write the mean and std of the final metrics to WORKDIR/{SUMMARY_FILE}.")
_COMPILE_ONLY = flags.DEFINE_string(
    "compile_only", None,
    "Compile the training and evaluation steps for TARGET on this machine, without data or "
    "devices, print the memory per device and exit: h100, h200, a100 (':N' GPUs, ':HxN' "
    "hosts x GPUs), v5e, v5p, v6e (':2x2' a TPU topology). Needs the compile extra.")
_COMPILATION_CACHE = flags.DEFINE_string(
    "compilation_cache", compilation_cache.default_directory(), compilation_cache.FLAG_HELP)
_DISTRIBUTED = flags.DEFINE_bool(
    "distributed", False,
    "Join a multi-process job that JAX detects itself (SLURM, Open MPI, Kubernetes, TPU).")


def default_workdir(config_path: str) -> str:
  name = config_path.rsplit("/", 1)[-1].removesuffix(".py")
  return f"runs/{name}"


def _print_report(report: dict) -> None:
  for name, value in report.items():
    print(f"{name}: {value:,.3f}" if isinstance(value, float) else
          f"{name}: {value:,d}" if isinstance(value, int) else f"{name}: {value}")


def _parse_flags(argv: list[str]):
  """absl's flag parsing (with `--config=FILE`, the config and its overrides are parsed
  here)."""
  try:
    return app.parse_flags_with_usage(config_names.resolve_argv(argv))
  except (KeyError, AttributeError) as e:
    _unknown_section(e)
  except config_names.UnknownConfigError as e:
    sys.exit(f"train.py: {e}")


def main(argv):
  del argv
  switch_kinds(_CONFIG.value, config_flags.get_override_values(flags.FLAGS["config"]))
  logging.set_verbosity(logging.WARNING)
  workdir = _WORKDIR.value or default_workdir(flags.FLAGS["config"].config_filename)
  compilation_cache.use_compilation_cache(_COMPILATION_CACHE.value)
  if _COMPILE_ONLY.value:
    _compile_only(_COMPILE_ONLY.value)
    return
  try:
    distributed.initialize(_COORDINATOR.value, _NUM_PROCESSES.value, _PROCESS_ID.value,
                           auto=_DISTRIBUTED.value)
    if _PRINT_PARAMS.value:
      with validation.inspecting():  # Reads no data: its files need not be set.
        _print_report(task_for(_CONFIG.value).param_report())
      return
    task = task_for(_CONFIG.value)  # Validates the whole config before any work.
    if _SEEDS.value:
      _train_seeds(workdir)
      return
    final = run_task(task, workdir)
  except (ConfigError, FileNotFoundError, BadSourceError, NonFiniteLossError,
          CheckpointRestoreError) as e:
    sys.exit(f"train.py: {e}")
  except CheckpointWriteError as e:
    _exit_after_background_writes(f"train.py: {e}")
  if jax.process_index() == 0:
    print(f"final ({workdir}): {format_metrics(final)}")


def _exit_after_background_writes(message: str) -> None:
  """Exits with status 1 and `message` printed last. Orbax reports the first failure of a save
  while the save's other writes go on in threads, which the interpreter awaits at exit; they
  report their own failures there (logged, and by asyncio when their unretrieved results are
  collected). `atexit` functions run once those threads have ended."""

  def report():
    gc.collect()  # Orbax's unretrieved results, reported now if at all.
    print(message, file=sys.stderr, flush=True)

  atexit.register(report)
  sys.exit(1)


def _compile_only(target_name: str) -> None:
  """`--compile_only`: compiles for the target and prints the memory report; exits non-zero
  with the compiler's message when a step does not compile. Reads no data, so the config is
  validated as `validation.inspecting()` does."""
  with validation.inspecting():
    _compile_for(target_name)


def _compile_for(target_name: str) -> None:
  try:
    target = targets.parse_target(target_name)
    targets.require_compiler(target)
    targets.use_cpu_backend()
    task = task_for(_CONFIG.value)
  except (targets.TargetError, ConfigError) as e:
    sys.exit(f"train.py: {e}")
  config = config_names.short_name(flags.FLAGS["config"].config_filename)
  print(f"compiling {config} for {target} ...", flush=True)
  try:
    compiled = compile_task(task, target)
  except (ConfigError, FileNotFoundError) as e:
    sys.exit(f"train.py: {e}")
  except DoesNotFitError as e:
    sys.exit(f"train.py: {e}\nLower the batch size or shard over more devices.")
  except Exception as e:  # The compiler's own error: what the user needs to see.
    sys.exit(f"train.py: compiling for {target} failed: {type(e).__name__}: {e}")
  print("\n".join(compiled.report()))


def _train_seeds(workdir: str) -> None:
  try:
    seeds = [int(s) for s in _SEEDS.value]
  except ValueError:
    sys.exit(f"train.py: --seeds must be comma-separated integers; got {_SEEDS.value}.")
  summary = run_seeds(_CONFIG.value, workdir, seeds, train_and_evaluate)
  if summary is None:
    sys.exit(f"train.py: interrupted; re-run the same command to resume ({workdir}).")
  if jax.process_index() == 0:
    for name, mean in summary["mean"].items():
      print(f"{name}: {mean:.6g} +- {summary['std'][name]:.2g} over seeds {seeds}")
    print(f"wrote {workdir}/{SUMMARY_FILE}")


def run() -> None:
  """`sparse-jax train`: the command line is `sys.argv`."""
  app.run(main, flags_parser=_parse_flags)


if __name__ == "__main__":
  run()
