"""Fine-tuning on the shared engine: exact resume with routing randomness in the backbone, and
two processes forming one device mesh equal to one device.

The backbone is a tiny sigma-MoE LM pretrained here with our own trainer; it keeps expert
dropout (drawn from the `routing` stream) and dropout (the `dropout` stream) while the memory
and head train on GLUE RTE served offline to TFDS's real builder.
"""

import json
import os
import subprocess
import sys

import jax
import numpy as np
import pytest
from flax import nnx
from lm_testing import tiny_lm_config
from training_testing import (assert_trees_equal, flat, free_port, patch_step, saved_item,
                              sigterm_at, train_losses)

import sparse_jax
from sparse_jax.configs import glue
from sparse_jax import parallel
from sparse_jax.finetune import methods
from sparse_jax.tasks import ClassificationTask, task_for, train_and_evaluate
from sparse_jax.tasks.backbones import build_classifier
from sparse_jax.training.checkpointing import Checkpointer

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def backbone_dir(stdlib_slice, tmp_path_factory):
  """A tiny byte LM whose MoE routing is random in training (expert dropout 0.1)."""
  root = tmp_path_factory.mktemp("backbone")
  config = tiny_lm_config(stdlib_slice, str(root / "tfds"))
  assert config.model.ff.expert_dropout > 0
  config.train.update(steps=2, warmup_steps=1, ckpt_every=2, log_every=2)
  train_and_evaluate(config, str(root / "run"))
  return str(root / "run")


def finetune_config(backbone_dir, data_dir, batch_size=2):
  config = glue.get_config("rte,spartan")
  config.backbone.update(kind="lm_checkpoint", path=backbone_dir)
  config.task.update(data_dir=data_dir, max_len=24)
  config.method.spartan.update(n_parents=4, n_children=2, top_k=2)
  config.train.update(steps=4, warmup_steps=1, batch_size=batch_size, log_every=1,
                      eval_every=100, ckpt_every=2, lr=1e-2)
  config.eval.batch_size = batch_size
  config.mesh.data = 1
  return config


def saved_trainable(workdir, config):
  """The trainable parameters of `workdir`'s latest checkpoint, as numpy."""
  model = build_classifier(config, num_classes=2)
  trainable = methods.trainable_filter(config.method)
  checkpointer = Checkpointer(workdir, params=task_for(config).checkpoint_params)
  checkpointer.restore_params(checkpointer.latest_step(), model)
  checkpointer.close()
  return jax.device_get(nnx.to_pure_dict(nnx.state(model, trainable)))


@pytest.fixture(scope="module")
def finetuned(backbone_dir, offline_glue, tmp_path_factory):
  """`(workdir, config)` of a 4-step SPARTAN run on the backbone, checkpoints at 2 and 4."""
  root = tmp_path_factory.mktemp("finetuned")
  config = finetune_config(backbone_dir, str(root / "tfds"))
  train_and_evaluate(config, str(root / "run"))
  return str(root / "run"), config


def test_resume_with_routing_randomness_is_bit_identical(finetuned, tmp_path, monkeypatch):
  straight, config = finetuned
  resumed = str(tmp_path / "resumed")
  with monkeypatch.context() as m:
    patch_step(m, sigterm_at(1))
    assert train_and_evaluate(config, resumed) == {"step": 2, "interrupted": 1.0}
  train_and_evaluate(config, resumed)

  assert train_losses(resumed) == train_losses(straight)
  jax.tree.map(np.testing.assert_array_equal, saved_trainable(resumed, config),
               saved_trainable(straight, config))


def test_load_puts_the_trained_part_on_the_backbone(finetuned, backbone_dir):
  """`sparse_jax.load` of a fine-tuning run: the checkpoint's trainable item (read directly)
  on top of the backbone's own pretrained checkpoint (read directly)."""
  workdir, config = finetuned
  model, saved_config = sparse_jax.load(workdir)
  assert ClassificationTask.resolve(saved_config) == ClassificationTask.resolve(config)
  trainable = methods.trainable_filter(config.method)
  assert_trees_equal(nnx.state(model, trainable), saved_item(workdir, 4, "trainable"))
  pretrained = flat(saved_item(backbone_dir, 2))
  frozen = flat(nnx.state(model.backbone, nnx.All(nnx.Param, nnx.Not(trainable))))
  assert frozen and set(frozen) <= set(pretrained)
  for name, value in frozen.items():
    np.testing.assert_array_equal(value, pretrained[name], err_msg=name)


def test_every_train_line_has_model_flops_counted_over_the_frozen_backbone(finetuned):
  workdir, config = finetuned
  with open(os.path.join(workdir, "metrics.jsonl"), encoding="utf-8") as f:
    train_lines = [r for r in map(json.loads, f) if r["split"] == "train"]
  assert [r["step"] for r in train_lines] == [1, 2, 3, 4]
  assert all(r["tflops_per_device"] > 0 for r in train_lines)  # training.mfu
  full = config.copy_and_resolve_references()
  full.method.kind = "full"  # Weight gradients of the whole backbone too.
  spartan_task, full_task = task_for(config), task_for(full)
  model = nnx.eval_shape(lambda: spartan_task.init_model_and_optimizer()[0])
  assert spartan_task.flops_per_step(model) < full_task.flops_per_step(model)


def two_processes(backbone_dir, data_dir, workdir):
  """`train.py` on the `finetune_config` run as two gloo-connected processes of 2 CPU devices
  (mesh data 2 x fsdp 2); returns their stdouts."""
  overrides = [
      "--config=glue:rte", "--config.backbone.kind=lm_checkpoint",
      f"--config.backbone.path={backbone_dir}", f"--config.task.data_dir={data_dir}",
      "--config.task.download=False", "--config.task.max_len=24",
      "--config.method.spartan.n_parents=4", "--config.method.spartan.n_children=2",
      "--config.method.spartan.top_k=2", "--config.train.steps=4", "--config.train.lr=1e-2",
      "--config.train.warmup_steps=1",
      "--config.train.batch_size=8", "--config.train.log_every=1", "--config.train.ckpt_every=2",
      "--config.eval.batch_size=8", "--config.mesh.data=2", "--config.mesh.fsdp=2",
      f"--workdir={workdir}", f"--coordinator_address=localhost:{free_port()}",
      "--num_processes=2"]
  env = dict(os.environ, JAX_PLATFORMS="cpu", JAX_NUM_CPU_DEVICES="2",
             JAX_CPU_COLLECTIVES_IMPLEMENTATION="gloo", JAX_DISABLE_MOST_OPTIMIZATIONS="1")
  workers = [subprocess.Popen([sys.executable, "train.py", *overrides, f"--process_id={i}"],
                              cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for i in range(2)]
  outputs = [w.communicate(timeout=600) for w in workers]
  for worker, (_, stderr) in zip(workers, outputs):
    assert worker.returncode == 0, stderr[-3000:]
  return [stdout for stdout, _ in outputs]


def test_finetune_on_a_mesh_of_two_processes_equals_one_device(backbone_dir, offline_glue,
                                                               tmp_path):
  """The two processes form a data 2 x fsdp 2 mesh of 4 devices, so this covers fine-tuning on
  a mesh and across processes at once. Tolerances as in test_parallel_training: a mesh
  reorders f32 reductions only (losses rtol 2e-5); Adam moves parameters by about lr per step
  whatever the gradient's size, so parameters get atol 1e-3, a tenth of lr."""
  config = finetune_config(backbone_dir, str(tmp_path / "tfds"), batch_size=8)
  one, processes = str(tmp_path / "one"), str(tmp_path / "processes")
  train_and_evaluate(config, one, mesh=parallel.make_mesh((1, 1, 1)))
  stdouts = two_processes(backbone_dir, str(tmp_path / "tfds"), processes)
  assert "final" in stdouts[0] and "final" not in stdouts[1]  # process 0 reports
  expected, got = train_losses(one), train_losses(processes)
  assert sorted(got) == [1, 2, 3, 4]
  np.testing.assert_allclose([got[s] for s in got], [expected[s] for s in got], rtol=2e-5)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-3),
               saved_trainable(processes, config), saved_trainable(one, config))
