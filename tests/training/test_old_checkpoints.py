"""A checkpoint written before checkpoints stored resolved configs still loads, evaluates and
resumes.

Until then a checkpoint held the config as its file gave it (the task's `config`, with only
the fields the file set, and the defaults the old `sparse_jax/configs/default.py` restated); now it
holds the resolved config (every default filled in) and resuming compares resolved values.
The old layout is made here by the engine itself, with `Task.resolved_config` returning the
config as given, as the engine did then.
"""

import math

import pytest
from lm_testing import tiny_lm_config

import sparse_jax
from sparse_jax.models import TransformerLM
from sparse_jax.tasks import evaluate_checkpoint, saved_config, train_and_evaluate
from sparse_jax.training.task import Task
from sparse_jax.validation import ConfigError

# Fields the old `sparse_jax/configs/default.py` set to their schemas' defaults.
RESTATED_DEFAULTS = {"model.attn_dropout": 0.0, "model.tie_embeddings": False,
                     "model.dtype": "float32", "model.ff.init": "sigma",
                     "model.ff.expert_hidden_dropout": 0.0, "model.ff.impl": "auto"}


def with_restated_defaults(config):
  for path, value in RESTATED_DEFAULTS.items():
    section, name = path.rsplit(".", 1)
    with config.unlocked():
      node = config
      for part in section.split("."):
        node = node[part]
      node[name] = value
  return config


@pytest.fixture(scope="module")
def old_run(tmp_path_factory, stdlib_slice):
  root = tmp_path_factory.mktemp("old_run")
  config = with_restated_defaults(tiny_lm_config(stdlib_slice, str(root / "tfds")))
  with pytest.MonkeyPatch.context() as patch:
    patch.setattr(Task, "resolved_config", lambda self: self.config)
    final = train_and_evaluate(config, str(root / "run"))
  return str(root / "run"), config, final


def test_the_old_layout_holds_the_config_as_given(old_run):
  workdir, _, _ = old_run
  _, saved = saved_config(workdir)
  assert "grad_accum_steps" not in saved.train  # a schema default the file never set


def test_an_old_checkpoint_loads_and_evaluates(old_run):
  workdir, _, final = old_run
  model, saved = sparse_jax.load(workdir)
  assert isinstance(model, TransformerLM) and saved.model.d_model == 32
  results, _ = evaluate_checkpoint(workdir, max_batches=4)  # as the run's final evaluation
  assert results["step"] == 6 and math.isclose(results["loss"], final["loss"], rel_tol=1e-5)


def test_an_old_checkpoint_resumes_with_a_thinner_config(old_run, stdlib_slice):
  workdir, config, _ = old_run
  thin = tiny_lm_config(stdlib_slice, config.data.data_dir)  # without the restated defaults
  wider = thin.copy_and_resolve_references()
  wider.model.d_model = 64
  with pytest.raises(ConfigError, match="model.d_model"):  # still refused: it changes the model
    train_and_evaluate(wider, workdir)
  thin.train.steps = 8
  assert train_and_evaluate(thin, workdir)["step"] == 8
  _, saved = saved_config(workdir, 8)
  assert saved.train.grad_accum_steps == 1  # the new checkpoint holds the resolved config

