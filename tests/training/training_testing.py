"""Helpers shared by the training tests: reading logged losses and checkpoint files, wrapping
the train step, the first steps on a mesh, train.py as one process and as two (gloo on
loopback), a free port for multi-process runs."""

import os
import signal
import socket
import subprocess
import sys

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest
from flax import nnx

from sparse_jax import parallel
from sparse_jax.tasks import task_for
from sparse_jax.tasks.lm import build_model
from sparse_jax.training import loop
from sparse_jax.training.checkpointing import Checkpointer
from sparse_jax.training.metrics_log import latest_records, read_metrics

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def train_losses(workdir) -> dict[int, float]:
  """The logged training loss of every step (log_every=1) from `workdir/metrics.jsonl`."""
  return {r["step"]: r["loss"] for r in latest_records(read_metrics(str(workdir)), "train")}


def saved_params(workdir, config) -> dict:
  """The parameters of `workdir`'s latest checkpoint, as a pure dict, in `config`'s model."""
  model = build_model(config)
  checkpointer = Checkpointer(workdir)
  checkpointer.restore_params(checkpointer.latest_step(), model)
  checkpointer.close()
  return nnx.to_pure_dict(nnx.state(model, nnx.Param))


def patch_step(monkeypatch, after_step):
  """Wraps the compiled train step; `after_step(step_index, outputs)` may alter its outputs."""
  real = loop.Run._compile_step

  def patched(self, batch, step):
    compiled = real(self, batch, step)

    def wrapped(state, carry, batch, step_index):
      return after_step(step_index, compiled(state, carry, batch, step_index))

    return wrapped

  monkeypatch.setattr(loop.Run, "_compile_step", patched)


def sigterm_at(stop_index):
  """An `after_step` for `patch_step` that sends this process SIGTERM during step
  `stop_index` (0-based), so the run saves and stops after it."""

  def after_step(step_index, outputs):
    if step_index == stop_index:
      os.kill(os.getpid(), signal.SIGTERM)
    return outputs

  return after_step


def first_steps(config, workdir, shape, n_steps=2):
  """Losses and gradient norms of `n_steps` training steps on a mesh of `shape`, and the
  parameters after them."""
  mesh = parallel.make_mesh(shape)
  run = loop.Run(task_for(config), workdir, mesh)
  with jax.set_mesh(mesh):
    metrics = [jax.device_get(run.step(i)) for i in range(n_steps)]
  run.close()
  losses = [(float(m["loss"]), float(m["grad_norm"])) for m in metrics]
  run.sync_to_modules()
  return losses, jax.device_get(nnx.to_pure_dict(nnx.state(run.model, nnx.Param))), run


def loopback_command(stdlib_slice, root, workdir):
  """`train.py` on a tiny LM over a data 2 x expert 2 mesh, data prepared in `root/tfds`."""
  return ["train.py", f"--workdir={workdir}",
          f"--config.data.source_root={stdlib_slice}", f"--config.data.data_dir={root}/tfds",
          "--config.data.batch_size=4", "--config.data.seq_len=16",
          "--config.model.d_model=16", "--config.model.n_layers=1", "--config.model.n_heads=2",
          "--config.model.mem_len=16", "--config.model.ff.n_experts=4",
          "--config.model.ff.expert_size=8", "--config.mesh.data=2", "--config.mesh.expert=2",
          "--config.train.steps=4", "--config.train.warmup_steps=1",
          "--config.train.log_every=1", "--config.train.ckpt_every=3",
          "--config.eval.batch_size=4", "--config.eval.max_batches=2"]


LOOPBACK_ENV = dict(JAX_PLATFORMS="cpu", JAX_NUM_CPU_DEVICES="2",
                    JAX_CPU_COLLECTIVES_IMPLEMENTATION="gloo", JAX_DISABLE_MOST_OPTIMIZATIONS="1")


def two_processes(command, sigterm_step=None) -> list[tuple[str, str]]:
  """Runs `command` as two gloo-connected processes of 2 CPU devices each; returns their
  (stdout, stderr). With `sigterm_step`, process 1 alone sends itself SIGTERM during that step
  (tests/fault_injection.py). Fails if either process fails, or if they have not both exited
  within 5 minutes (a hang: a few seconds of training here)."""
  address = f"localhost:{free_port()}"
  workers = []
  for i in range(2):
    signalled = i == 1 and sigterm_step is not None
    env = {**os.environ, **LOOPBACK_ENV}
    if signalled:
      env["FAULT_SIGTERM"] = str(sigterm_step)
    launcher = ["-m", "tests.fault_injection"] if signalled else []
    workers.append(subprocess.Popen(
        [sys.executable, *launcher, *command, f"--coordinator_address={address}",
         "--num_processes=2", f"--process_id={i}"],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
  try:
    outputs = [w.communicate(timeout=300) for w in workers]
  except subprocess.TimeoutExpired:
    for worker in workers:
      worker.kill()
    pytest.fail("the two processes hung: not both exited within 5 minutes")
  for worker, (_, stderr) in zip(workers, outputs):
    assert worker.returncode == 0, stderr[-3000:]
  return outputs


def one_and_two_processes(stdlib_slice, root, flags=()) -> list[str]:
  """`loopback_command` (with `flags` after its own, which they override) run to the end as
  one process of 4 CPU devices (`root/single`, which also prepares the data) and as two
  processes of 2 (`root/multi`); the two processes' stdouts."""
  env = {**os.environ, **LOOPBACK_ENV, "JAX_NUM_CPU_DEVICES": "4"}
  single = subprocess.run(
      [sys.executable, *loopback_command(stdlib_slice, root, root / "single"), *flags],
      cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
  assert single.returncode == 0, single.stderr[-3000:]
  outputs = two_processes([*loopback_command(stdlib_slice, root, root / "multi"), *flags])
  return [stdout for stdout, _ in outputs]


def free_port() -> int:
  """A TCP port on localhost that nothing listens on (for a multi-process coordinator)."""
  with socket.socket() as s:
    s.bind(("localhost", 0))
    return s.getsockname()[1]


def saved_item(workdir, step, item="params"):
  """Checkpoint `step`'s `item` as Orbax wrote it (nested dicts of numpy arrays), read without
  any model or devices (so also one written by several processes, on another mesh)."""
  path = os.path.join(workdir, "checkpoints", str(step), item)
  checkpointer = ocp.PyTreeCheckpointer()
  as_numpy = jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray),
                          checkpointer.metadata(path).item_metadata.tree)
  return checkpointer.restore(path, args=ocp.args.PyTreeRestore(restore_args=as_numpy))


def flat(tree) -> dict[str, np.ndarray]:
  """`{"blocks/0/attn/w_q": array}` of an `nnx.State` or of a checkpoint item as Orbax
  wrote it (its `{"value": array}` leaf wrappers dropped)."""
  if isinstance(tree, nnx.State):
    tree = nnx.to_pure_dict(tree)
  leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
  return {"/".join(str(getattr(k, "key", k)) for k in path if getattr(k, "key", k) != "value"):
          np.asarray(leaf) for path, leaf in leaves}


def assert_trees_equal(got, expected):
  got, expected = flat(got), flat(expected)
  assert sorted(got) == sorted(expected)
  for name, value in expected.items():
    np.testing.assert_array_equal(got[name], value, err_msg=name)
