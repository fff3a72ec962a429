"""Checkpoint faults: a corrupt or partial latest step falls back to the one before it (with a
warning naming it, then training redoes the lost steps bit for bit); no readable step is an
error that names each step and moves nothing; a failed write (disk full) stops the run with a
message and the last good step intact; resuming with a changed config refuses model and data
changes, naming the fields, and accepts the safe ones."""

import errno
import logging
import os
import shutil
import subprocess
import sys

import pytest
from flax import nnx
from orbax.checkpoint._src.path import async_path
from lm_testing import tiny_lm_config
from training_testing import assert_trees_equal, saved_item, train_losses

from sparse_jax import parallel
from sparse_jax.tasks import task_for, train_and_evaluate
from sparse_jax.training import checkpointing
from sparse_jax.training.checkpointing import (CheckpointRestoreError, CheckpointWriteError,
                                               Checkpointer)
from sparse_jax.training.loop import Run
from sparse_jax.training.placement import Placement
from sparse_jax.validation import ConfigError

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ITEMS = ("params", "opt_state", "memory")


@pytest.fixture(scope="module")
def trained(stdlib_slice, tmp_path_factory):
  """`(workdir, config)`: the tiny LM trained 6 steps uninterrupted, checkpoints at 3 and 6."""
  root = tmp_path_factory.mktemp("trained")
  config = tiny_lm_config(stdlib_slice, str(root / "tfds"))
  train_and_evaluate(config, str(root / "run"))
  return str(root / "run"), config


def _copy(trained, tmp_path) -> str:
  workdir = str(tmp_path / "run")
  shutil.copytree(trained[0], workdir)
  return workdir


def _largest_file(directory) -> str:
  files = [os.path.join(d, f) for d, _, fs in os.walk(directory) for f in fs]
  return max(files, key=os.path.getsize)


def _truncate(path) -> None:
  with open(path, "r+b") as f:
    f.truncate(os.path.getsize(path) // 2)


# Each: (what it breaks in step 6, how).
CORRUPTIONS = {
    "parameter data truncated": lambda step: _truncate(_largest_file(f"{step}/params")),
    "parameter metadata deleted": lambda step: os.remove(f"{step}/params/_METADATA"),
    "optimiser data deleted": lambda step: os.remove(_largest_file(f"{step}/opt_state")),
    "XL memory item missing": lambda step: shutil.rmtree(f"{step}/memory"),
    "data position truncated": lambda step: _truncate(f"{step}/data/process_0-of-1.json"),
    "saved config truncated": lambda step: _truncate(f"{step}/config/metadata"),
}


def _restores(workdir, step, config) -> bool:
  """Whether step `step` restores in full (config included) into a fresh model."""
  task = task_for(config)
  placement = Placement(parallel.mesh_from_config(task.typed.mesh))
  model, optimizer = task.build(placement)
  carry = task.init_carry(model, placement)
  checkpointer = Checkpointer(workdir, params=task.checkpoint_params)
  try:
    checkpointer.restore_config(step)
    checkpointer.restore(step, model=model, optimizer=optimizer,
                         data_iterator=task.load_data(placement),
                         extras=task.checkpoint_extras(carry))
    return True
  except Exception:  # pylint: disable=broad-except
    return False
  finally:
    checkpointer.close()


@pytest.mark.parametrize("corruption", sorted(CORRUPTIONS))
def test_a_broken_latest_step_falls_back_to_the_one_before(corruption, trained, tmp_path,
                                                           caplog):
  workdir, config = _copy(trained, tmp_path), trained[1]
  CORRUPTIONS[corruption](os.path.join(workdir, "checkpoints", "6"))
  assert not _restores(workdir, 6, config), "the corruption must break the step"

  with caplog.at_level(logging.WARNING):
    final = train_and_evaluate(config, workdir)
  warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
  moved = os.path.join(workdir, "broken_checkpoints", "6")
  assert any("step 6 does not read back" in w and moved in w and "from step 3" in w
             for w in warnings), warnings
  assert os.path.isdir(moved)
  # Steps 4-6 were trained again from step 3: the same step 6 as the uninterrupted run.
  assert final["step"] == 6 and Checkpointer(workdir).all_steps() == [3, 6]
  for item in ITEMS:
    assert_trees_equal(saved_item(workdir, 6, item), saved_item(trained[0], 6, item))


def test_no_readable_step_is_an_error_naming_each_and_moves_nothing(trained, tmp_path):
  workdir, config = _copy(trained, tmp_path), trained[1]
  for step in ("3", "6"):
    _truncate(_largest_file(os.path.join(workdir, "checkpoints", step, "params")))
  lines_before = open(os.path.join(workdir, "metrics.jsonl")).read()
  with pytest.raises(CheckpointRestoreError) as error:
    train_and_evaluate(config, workdir)
  message = str(error.value)
  assert "step 6:" in message and "step 3:" in message and "start fresh" in message
  assert sorted(os.listdir(os.path.join(workdir, "checkpoints"))) == ["3", "6"]
  assert not os.path.exists(os.path.join(workdir, "broken_checkpoints"))
  assert open(os.path.join(workdir, "metrics.jsonl")).read() == lines_before  # not started


def test_readers_change_nothing_in_a_run_being_written(trained, tmp_path):
  """Evaluation and loading may run beside training: a save in flight (its temporary
  directory) is left alone, and a missing workdir is not created."""
  workdir = _copy(trained, tmp_path)
  in_flight = os.path.join(workdir, "checkpoints", "9.orbax-checkpoint-tmp-1234")
  os.makedirs(os.path.join(in_flight, "params"))
  reader = Checkpointer(workdir, read_only=True)
  assert reader.all_steps() == [3, 6]
  reader.close()
  assert os.path.isdir(os.path.join(in_flight, "params"))
  missing = str(tmp_path / "missing")
  assert Checkpointer(missing, read_only=True).all_steps() == []
  assert not os.path.exists(missing)
  Checkpointer(workdir).close()  # A writer starting there removes the leftover.
  assert not os.path.exists(in_flight)


def test_a_process_stopping_before_it_saves_removes_leftovers_without_a_traceback(tmp_path):
  """A killed save's temporary directory is removed when a writer is created, not by a thread
  left running (Orbax's own cleanup, awaited only by its first save, failed at interpreter
  exit): a run that stops before saving ends with its own message only."""
  leftover = tmp_path / "checkpoints" / "9.orbax-checkpoint-tmp-1234"
  (leftover / "params").mkdir(parents=True)
  (leftover / "params" / "data").write_text("partial")
  script = ("import sys; from sparse_jax.training.checkpointing import Checkpointer; "
            "Checkpointer(sys.argv[1]).close(); sys.exit('stopped before saving')")
  stopped = subprocess.run([sys.executable, "-c", script, str(tmp_path)], cwd=REPO,
                           env=dict(os.environ, JAX_PLATFORMS="cpu"), capture_output=True,
                           text=True, timeout=300)
  assert (stopped.returncode, stopped.stderr) == (1, "stopped before saving\n"), stopped.stderr
  assert not leftover.exists()


def test_a_full_disk_during_a_save_stops_with_the_last_step_intact(trained, tmp_path,
                                                                    monkeypatch):
  """A failing writer: every file Orbax writes for step 6 fails with ENOSPC."""
  workdir, config = str(tmp_path / "run"), trained[1]
  real_write = async_path.write_text

  async def full_disk(path, text, *args, **kwargs):
    if "/checkpoints/6" in os.fspath(path):
      raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), os.fspath(path))
    return await real_write(path, text, *args, **kwargs)

  monkeypatch.setattr(async_path, "write_text", full_disk)
  with pytest.raises(CheckpointWriteError) as error:
    train_and_evaluate(config, workdir)
  message = str(error.value)
  assert "step 6" in message and "No space left on device" in message
  assert "step 3, is intact" in message
  monkeypatch.undo()
  assert Checkpointer(workdir).all_steps() == [3]
  for item in ITEMS:
    assert_trees_equal(saved_item(workdir, 3, item), saved_item(trained[0], 3, item))


def test_a_write_error_names_the_os_error_wherever_tensorstore_puts_it():
  """TensorStore may give the OS error only as a number, in the middle of a long message (as
  in a CI run: `[os_error_code='27']` between a path and a kilobyte of JSON spec)."""
  spec = "{" + ",".join(f'"key{i}":"{"x" * 20}"' for i in range(60)) + "}"
  error = ValueError(f'OUT_OF_RANGE: Error writing "valid/.zarray" in OCDBT database at '
                     f'local file "/tmp/{"d" * 300}/4.orbax-checkpoint-tmp" '
                     f"[os_error_code='{errno.EFBIG}'] [spec='{spec}']")
  summary = checkpointing._summary  # pylint: disable=protected-access
  assert summary(error).startswith("ValueError: OUT_OF_RANGE: Error writing")
  assert summary(error).endswith("; OS error 27: File too large"), summary(error)
  assert len(summary(error)) < 600, len(summary(error))
  assert summary(OSError("plain")) == "OSError: plain"


def test_train_py_stops_cleanly_when_a_save_exceeds_the_file_size_limit(stdlib_slice,
                                                                         tmp_path):
  """A real write error from the OS: from the save of step 4 on, files may not exceed 8 KB
  (RLIMIT_FSIZE), smaller than the parameter files; metrics lines still fit. train.py exits
  with one message, step 2 intact; run again with a changed model, it refuses in one line;
  run again as before without the limit, it resumes from step 2."""
  flags = [f"--workdir={tmp_path / 'run'}", f"--config.data.source_root={stdlib_slice}",
           f"--config.data.data_dir={tmp_path / 'tfds'}", "--config.data.batch_size=4",
           "--config.data.seq_len=16", "--config.model.d_model=32", "--config.model.n_layers=2",
           "--config.model.n_heads=2", "--config.model.mem_len=16",
           "--config.model.ff.n_experts=4", "--config.model.ff.expert_size=16",
           "--config.train.steps=4", "--config.train.warmup_steps=1",
           "--config.train.ckpt_every=2", "--config.train.log_every=2",
           "--config.eval.batch_size=2", "--config.eval.max_batches=1",
           "--config.eval.mem_len=32"]
  env = dict(os.environ, JAX_PLATFORMS="cpu", JAX_DISABLE_MOST_OPTIMIZATIONS="1")
  command = [sys.executable, "-m", "tests.fault_injection", "train.py", *flags]
  failed = subprocess.run(command, cwd=REPO, env=dict(env, FAULT_FSIZE="4:8000"),
                          capture_output=True, text=True, timeout=600)
  assert failed.returncode == 1, failed.stderr[-3000:]
  # Orbax logs the failed writes; the process ends with train.py's message, not a traceback.
  last = failed.stderr.strip().splitlines()[-1]
  assert last.startswith("train.py: writing the checkpoint of step 4"), failed.stderr[-3000:]
  assert "File too large" in last and "step 2, is intact" in last, last
  assert Checkpointer(str(tmp_path / "run")).all_steps() == [2]

  # Resuming with a model change: refused naming the field, before any work; the message is
  # all that is printed.
  refused = subprocess.run([*command, "--config.model.d_model=64"], cwd=REPO, env=env,
                           capture_output=True, text=True, timeout=600)
  assert refused.returncode == 1 and refused.stderr.startswith("train.py: "), refused.stderr
  assert "model.d_model: 32 in the checkpoint, 64 now" in refused.stderr
  last = refused.stderr.strip().splitlines()[-1]
  assert last.startswith("Run with the checkpoint's values"), refused.stderr

  resumed = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True,
                           timeout=600)
  assert resumed.returncode == 0, resumed.stderr[-3000:]
  assert "Resuming from the checkpoint of step 2" in resumed.stdout
  assert Checkpointer(str(tmp_path / "run")).all_steps() == [2, 4]


# --- Resuming with a changed config.

REFUSED = {
    "model.d_model": 64,
    "model.ff.k": 1,
    "model.vocab_size": 300,
    "data.seq_len": 8,
    "data.batch_size": 2,
    "seed": 1,
    "train.optimizer": "adafactor",
}
ACCEPTED = {
    "train.steps": 9,
    "train.lr": 1e-3,
    "train.log_every": 2,
    "train.ckpt_every": 1,
    "eval.max_batches": 2,
}


def _changed(config, path, value):
  config = config.copy_and_resolve_references()
  section = config
  *parents, leaf = path.split(".")
  for name in parents:
    section = section[name]
  section[leaf] = value
  return config


@pytest.mark.parametrize("path", sorted(REFUSED))
def test_resuming_with_a_model_or_data_change_is_refused_naming_the_field(path, trained,
                                                                         tmp_path):
  workdir = _copy(trained, tmp_path)
  config = _changed(trained[1], path, REFUSED[path])
  with pytest.raises(ConfigError) as error:
    train_and_evaluate(config, workdir)
  message = str(error.value)
  assert f"{path}: " in message and "checkpoint of step 6" in message
  assert "--workdir" in message
  assert train_losses(workdir) == train_losses(trained[0])  # nothing trained


def test_several_refused_fields_are_all_named(trained, tmp_path):
  config = _changed(_changed(trained[1], "model.n_heads", 4), "data.seq_len", 8)
  with pytest.raises(ConfigError) as error:
    train_and_evaluate(config, _copy(trained, tmp_path))
  assert "model.n_heads: 2 in the checkpoint, 4 now" in str(error.value)
  assert "data.seq_len: 16 in the checkpoint, 8 now" in str(error.value)


@pytest.mark.parametrize("path", sorted(ACCEPTED))
def test_resuming_with_a_safe_change_continues(path, trained, tmp_path, caplog):
  workdir = _copy(trained, tmp_path)
  config = _changed(trained[1], path, ACCEPTED[path])
  with caplog.at_level(logging.WARNING):
    run = Run(task_for(config), workdir, parallel.mesh_from_config(
        task_for(config).typed.mesh))
    run.close()
  assert run.start == 6
  assert any(f"config field {path} changed" in r.getMessage() for r in caplog.records)
  for item in ITEMS:
    assert_trees_equal(nnx_state_item(run, item), saved_item(workdir, 6, item))


def nnx_state_item(run, item):
  if item == "params":
    return nnx.state(run.model, checkpointing.NOT_RNG)
  if item == "opt_state":
    return nnx.state(run.optimizer)
  return run.task.checkpoint_extras(run.carry)[item]
