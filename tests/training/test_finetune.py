"""Fine-tuning a frozen RoBERTa-compatible backbone: freezing, trainable-only checkpoints
reloaded onto the backbone and the whole `train.py`/`eval.py` path on GLUE RTE (served
offline to TFDS's real builder). Exact resume: `test_finetune_engine.py`."""

import json
import os

import jax
import numpy as np
import pytest
from flax import nnx
from hf_testing import reference_copy

from sparse_jax.configs import glue
from sparse_jax.finetune import methods
from sparse_jax.tasks import task_for, train_and_evaluate
from sparse_jax.tasks.backbones import build_classifier, load_tokenizer
from sparse_jax.tasks.runs import evaluate_checkpoint
from sparse_jax.training.optimizer import BatchedTrainConfig, make_optimizer
from sparse_jax.training.steps import make_train_step
from sparse_jax.validation import ConfigError


@pytest.fixture(scope="module")
def roberta_dir(tmp_path_factory):
  return reference_copy("roberta_320", tmp_path_factory.mktemp("roberta"))


def rte_config(roberta_dir, data_dir, method="spartan"):
  config = glue.get_config(f"rte,{method}")
  config.backbone.path = roberta_dir
  config.task.data_dir = data_dir
  config.task.max_len = 24
  config.method.spartan.update(n_parents=4, n_children=2, top_k=2)
  config.method.adapter.bottleneck = 4
  config.train.update(steps=4, warmup_steps=1, batch_size=2, log_every=1, eval_every=100,
                      ckpt_every=2)
  config.eval.batch_size = 2
  config.mesh.data = 1  # one device; test_finetune_on_a_mesh_equals_one_device uses 8.
  return config


def _flat(state):
  return {jax.tree_util.keystr(path): np.asarray(leaf)
          for path, leaf in jax.tree_util.tree_leaves_with_path(state)}


@pytest.mark.parametrize("method", ["spartan", "houlsby", "pfeiffer", "head", "full"])
def test_only_the_methods_parameters_change(roberta_dir, tmp_path, method):
  config = rte_config(roberta_dir, str(tmp_path), method)
  config.train.lr = 1e-2
  model, tokenizer = build_classifier(config, num_classes=2), load_tokenizer(config.backbone)
  trainable = methods.trainable_filter(config.method)
  train = BatchedTrainConfig.parse(config.train, "train")
  optimizer = nnx.Optimizer(model, make_optimizer(train), wrt=trainable)
  before_trainable = _flat(nnx.state(model, trainable))
  frozen = nnx.All(nnx.Param, nnx.Not(trainable))
  before_frozen = _flat(nnx.state(model, frozen))
  # The optimiser holds Adam's two moments for the trainable parameters only.
  moments = [x for x in jax.tree.leaves(nnx.state(optimizer)) if x.ndim]
  assert len(moments) == 2 * len(before_trainable)
  assert sum(x.size for x in moments) == 2 * sum(x.size for x in before_trainable.values())

  graphdef, state = nnx.split((model, optimizer))
  state = nnx.to_pure_dict(state)
  step = make_train_step(graphdef, task_for(config).loss, seed=0, wrt=trainable)
  tokens, lengths = tokenizer.encode((["A dog runs.", "It rains hard today."],
                                      ["An animal moves.", "Sun."]), 24)
  batch = {"tokens": tokens, "lengths": lengths, "labels": np.array([0, 1], np.int32)}
  for i in range(3):
    state, _, _ = step(state, None, batch, i)
  nnx.update((model, optimizer), state)

  after_frozen = _flat(nnx.state(model, frozen))
  assert after_frozen.keys() == before_frozen.keys()
  assert (len(before_frozen) == 0) == (method == "full")
  for name, value in before_frozen.items():
    np.testing.assert_array_equal(after_frozen[name], value, err_msg=name)
  after_trainable = _flat(nnx.state(model, trainable))
  changed = [n for n, v in before_trainable.items() if not np.array_equal(after_trainable[n], v)]
  assert len(changed) == len(before_trainable), set(before_trainable) - set(changed)


def test_finetune_saves_the_trainable_part_and_eval_reloads_it(roberta_dir, offline_glue,
                                                               tmp_path):
  config = rte_config(roberta_dir, str(tmp_path / "tfds"))
  workdir = str(tmp_path / "run")
  final = train_and_evaluate(config, workdir)
  assert final["step"] == 4 and 0.0 <= final["accuracy"] <= 1.0

  with open(os.path.join(workdir, "storage.json")) as f:
    storage = json.load(f)
  model = build_classifier(config, num_classes=2)
  n_trainable = sum(x.size for x in jax.tree.leaves(
      nnx.state(model, methods.trainable_filter(config.method))))
  # SPARTAN (4 + 2*4*2) d per layer, RoBERTa's head, and the LayerNorms; nothing else.
  d, layers, norms = 32, 2, 1 + 2 * 2
  assert n_trainable == (4 + 16) * d * layers + (d * d + d + 2 * d + 2) + norms * 2 * d
  assert storage["trainable_params"] == n_trainable < storage["total_params"] / 3
  report = task_for(config).param_report()  # what `train.py --print_params` prints
  assert report["trainable_params"] == n_trainable
  assert report["model_params"] == storage["total_params"]
  assert n_trainable * 4 <= storage["trainable_bytes_on_disk"] < storage["total_params"] * 4 / 2

  results, path = evaluate_checkpoint(workdir)
  assert results["step"] == 4 and results["accuracy"] == final["accuracy"]
  assert os.path.exists(path)


def test_bad_fields_are_named(roberta_dir, tmp_path):
  config = rte_config(roberta_dir, str(tmp_path))
  config.method.kind = "lora"
  with pytest.raises(ConfigError, match="method.kind"):
    train_and_evaluate(config, str(tmp_path / "run"))
  config = rte_config(roberta_dir, str(tmp_path))
  config.backbone.path = str(tmp_path / "missing")
  with pytest.raises(FileNotFoundError, match="config.json"):
    train_and_evaluate(config, str(tmp_path / "run"))
  with pytest.raises(ValueError, match="fewshot"):
    glue.get_config("rte,spartan,tenshot")
