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

import jax
import numpy as np
import pytest
from flax import nnx
from jax.sharding import PartitionSpec as P
from training_testing import (assert_trees_equal, first_steps, loopback_command,
                              one_and_two_processes, patch_step, saved_item, sigterm_at,
                              train_losses, two_processes)

from sparse_jax import parallel
from sparse_jax.tasks import train_and_evaluate



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


@pytest.fixture(scope="module")
def loopback_runs(stdlib_slice, tmp_path_factory):
  """`train.py` run to the end as one process of 4 CPU devices (`root/single`, which also
  prepares the data) and as two processes of 2 (`root/multi`); `(root, the two stdouts)`."""
  root = tmp_path_factory.mktemp("loopback")
  return root, one_and_two_processes(stdlib_slice, root)


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
  command = loopback_command(stdlib_slice, root, workdir)
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
