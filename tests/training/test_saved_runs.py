"""`sparse_jax.load`: a trained run's model rebuilt from its saved config, every saved
variable restored (checked against the checkpoint's files read directly with Orbax)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from lm_testing import tiny_lm_config
from training_testing import assert_trees_equal, saved_item

import sparse_jax
from sparse_jax.models import TransformerLM
from sparse_jax.tasks import LanguageModelTask, train_and_evaluate
from sparse_jax.training.checkpointing import NOT_RNG, NoCheckpointError


@pytest.fixture(scope="module")
def lm_run(tmp_path_factory, stdlib_slice):
  root = tmp_path_factory.mktemp("lm_run")
  config = tiny_lm_config(stdlib_slice, str(root / "tfds"))  # checkpoints at steps 3 and 6
  train_and_evaluate(config, str(root / "run"))
  return str(root / "run"), config


def test_load_restores_the_latest_checkpoint_of_a_language_model(lm_run):
  workdir, trained_config = lm_run
  model, config = sparse_jax.load(workdir)
  assert isinstance(model, TransformerLM)
  # The checkpoint stores the config resolved: every default filled in.
  assert LanguageModelTask.resolve(config) == LanguageModelTask.resolve(trained_config)
  assert "grad_accum_steps" not in trained_config.train and config.train.grad_accum_steps == 1
  assert_trees_equal(nnx.state(model, NOT_RNG),
                     saved_item(workdir, 6))


def test_load_picks_the_step_asked_for(lm_run):
  workdir, _ = lm_run
  early, _ = sparse_jax.load(workdir, step=3)
  late, _ = sparse_jax.load(workdir)
  assert_trees_equal(nnx.state(early, NOT_RNG),
                     saved_item(workdir, 3))
  early_w = jax.tree.leaves(nnx.state(early, nnx.Param))
  late_w = jax.tree.leaves(nnx.state(late, nnx.Param))
  assert any(not np.array_equal(a, b) for a, b in zip(early_w, late_w))  # training moved them


def test_loaded_model_is_in_eval_mode(lm_run):
  """Dropout 0.1 and expert dropout are on in training mode; a loaded model is deterministic."""
  model, config = sparse_jax.load(lm_run[0])
  tokens = jax.random.randint(jax.random.key(0), (2, config.data.seq_len), 0, 256)
  first, _, _ = model(tokens)
  second, _, _ = model(tokens)
  np.testing.assert_array_equal(first, second)
  assert bool(jnp.all(jnp.isfinite(first)))


def test_load_of_a_missing_run_or_step_names_what_exists(lm_run, tmp_path):
  with pytest.raises(NoCheckpointError, match="no checkpoint in .*empty.*train first"):
    sparse_jax.load(str(tmp_path / "empty"))
  with pytest.raises(NoCheckpointError, match=r"step 5 .*available steps: \[3, 6\]"):
    sparse_jax.load(lm_run[0], step=5)
