"""Training on device meshes equals training on one device (8 simulated CPU devices), also
as two processes (gloo on loopback), which stop together when a SIGTERM reaches only one.

Tolerances: a mesh changes only the order of f32 reductions (partial sums per device, then
collectives), so losses and gradient norms agree to a few f32 ulps of the summed magnitudes
(rtol 2e-5). Parameters after Adam steps get atol 1e-4, a tenth of the largest step's
learning rate (1e-3): Adam normalises every update to about `lr`, so an element whose
gradient is itself at reduction-noise level (|g| ~ 1e-7) can move by a visible fraction of
`lr` differently. The gradient norms catch what Adam's scale invariance would hide (say, a
gradient missing a factor from a collective).
"""

import os
import subprocess
import sys

import jax
import numpy as np
import pytest
from flax import nnx
from jax.sharding import PartitionSpec as P
from training_testing import (assert_trees_equal, first_steps, free_port, patch_step,
                              saved_item, sigterm_at, train_losses)

from sparse_jax import parallel
from sparse_jax.tasks import train_and_evaluate

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture
def mesh_config(tiny_config):
  """The tiny sigma-MoE with 8 experts and batches of 8, so every mesh of 8 splits them."""
  tiny_config.data.batch_size = 8
  tiny_config.eval.batch_size = 8
  tiny_config.model.ff.n_experts = 8
  return tiny_config


def test_training_steps_on_a_mesh_equal_one_device(mesh_config, tmp_path):
  mesh_config.data.data_dir = str(tmp_path / "tfds")
  ref_losses, ref_params, _ = first_steps(mesh_config, str(tmp_path / "one"), (1, 1, 1))
  for shape in [(8, 1, 1), (2, 2, 2), (1, 1, 8), (1, 8, 1)]:
    losses, params, run = first_steps(mesh_config, str(tmp_path / str(shape)), shape)
    np.testing.assert_allclose(losses, ref_losses, rtol=2e-5, err_msg=str(shape))
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-4, err_msg=str(shape)),
                 params, ref_params)
    assert_state_sharded(run, shape)


def assert_state_sharded(run, shape):
  """Expert weights split over `expert`; with fsdp, the embedding and its Adam moments over
  `fsdp`; the XL memory over the batch axes."""
  _, fsdp, expert = shape
  w_up = run.model.blocks[0].ff.w_up[...]
  assert w_up.sharding.spec[0] == parallel.EXPERT  # a no-op where the expert axis is 1
  assert w_up.addressable_shards[0].data.shape[0] == 8 // expert
  if fsdp > 1:
    embedding_spec = run.model.embed.embedding[...].sharding.spec
    assert parallel.FSDP in embedding_spec
    moments = [leaf for path, leaf in jax.tree.leaves_with_path(nnx.state(run.optimizer))
               if "embedding" in jax.tree_util.keystr(path)]
    assert len(moments) == 2 and all(m.sharding.spec == embedding_spec for m in moments)
  assert run.carry.hidden_lbmd.sharding.spec == P(None, parallel.BATCH_AXES, None, None)


def test_save_on_eight_devices_restore_on_four_and_continue(mesh_config, tmp_path,
                                                            monkeypatch):
  mesh_config.train.update(steps=4, ckpt_every=2, log_every=1)
  mesh_config.data.data_dir = str(tmp_path / "tfds")
  eight, four = parallel.make_mesh((2, 2, 2)), parallel.make_mesh((1, 2, 2))
  straight, resharded = str(tmp_path / "straight"), str(tmp_path / "resharded")
  train_and_evaluate(mesh_config, straight, mesh=eight)

  with monkeypatch.context() as m:
    patch_step(m, sigterm_at(1))
    assert train_and_evaluate(mesh_config, resharded, mesh=eight)["step"] == 2
  train_and_evaluate(mesh_config, resharded, mesh=four)

  expected, got = train_losses(straight), train_losses(resharded)
  assert sorted(got) == [1, 2, 3, 4]
  np.testing.assert_allclose([got[s] for s in range(1, 5)], [expected[s] for s in range(1, 5)],
                             rtol=2e-5)


def _train_command(stdlib_slice, root, workdir):
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


@pytest.fixture(scope="module")
def loopback_runs(stdlib_slice, tmp_path_factory):
  """`train.py` run to the end as one process of 4 CPU devices (`root/single`, which also
  prepares the data) and as two processes of 2 (`root/multi`); `(root, the two stdouts)`."""
  root = tmp_path_factory.mktemp("loopback")
  env = {**os.environ, **LOOPBACK_ENV, "JAX_NUM_CPU_DEVICES": "4"}
  single = subprocess.run([sys.executable, *_train_command(stdlib_slice, root, root / "single")],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
  assert single.returncode == 0, single.stderr[-3000:]
  outputs = two_processes(_train_command(stdlib_slice, root, root / "multi"))
  return root, [stdout for stdout, _ in outputs]


def test_two_processes_on_loopback_train_like_one(loopback_runs):
  """train.py as two gloo-connected processes of 2 CPU devices each equals one process of 4."""
  root, stdouts = loopback_runs
  assert "final" in stdouts[0] and "final" not in stdouts[1]  # process 0 reports
  multi, one = train_losses(root / "multi"), train_losses(root / "single")
  assert sorted(multi) == [1, 2, 3, 4]
  np.testing.assert_allclose([multi[s] for s in multi], [one[s] for s in multi], rtol=2e-5)


def test_sigterm_reaching_one_process_stops_both_after_the_same_step(loopback_runs,
                                                                      stdlib_slice):
  """SIGTERM reaches process 1 alone, during its first step. Both processes stop after step 2
  (the agreement is read one step late, `training.preemption`), save that step as one
  checkpoint and exit alike; run again, they resume from it and end with the parameters,
  optimiser state, XL memory and data positions of the uninterrupted run, bit for bit.
  Without the agreement, process 1 enters the collective save while process 0 takes step 2:
  they hang."""
  root, _ = loopback_runs
  workdir, reference = root / "preempted", root / "multi"
  command = _train_command(stdlib_slice, root, workdir)
  outputs = two_processes(command, sigterm_step=0)
  for _, stderr in outputs:
    assert "Stopped at step 2;" in stderr, stderr[-3000:]
  assert "final" in outputs[0][0] and "interrupted=1" in outputs[0][0]
  checkpoints = workdir / "checkpoints"
  assert os.listdir(checkpoints) == ["2"]  # One step, and no temporary directory left.
  data_files = ["process_0-of-2.json", "process_1-of-2.json"]
  assert set(data_files) <= set(os.listdir(checkpoints / "2" / "data"))  # Each one's position.

  two_processes(command)
  assert train_losses(workdir) == train_losses(reference)
  for item in ("params", "opt_state", "memory"):
    assert_trees_equal(saved_item(workdir, 4, item), saved_item(reference, 4, item))
  for name in data_files:
    assert ((workdir / "checkpoints/4/data" / name).read_text() ==
            (reference / "checkpoints/4/data" / name).read_text())
