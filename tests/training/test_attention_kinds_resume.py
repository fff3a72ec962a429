"""Attention kinds without XL memory train, checkpoint and resume exactly: SwitchHead, and
causal attention, whose empty `[L, B, 0, d]` memory Orbax refused to save (so no causal LM
could checkpoint) until the LM task stopped saving it; and a config saved before SwitchHead's
fields existed resumes."""

import copy

import jax
import numpy as np
import pytest
from training_testing import patch_step, saved_item, sigterm_at

from sparse_jax.tasks import train_and_evaluate
from sparse_jax.tasks.lm import LanguageModelTask
from sparse_jax.training import resume_config
from sparse_jax.validation import ConfigError


@pytest.mark.parametrize("attention", ["switchhead", "causal"])
def test_training_resumes_exactly_from_its_checkpoint(attention, tiny_config, tmp_path,
                                                      monkeypatch):
  """Stopped after step 2 of 4 (as on SIGTERM) and resumed, a run ends with the parameters
  of an uninterrupted one, bit for bit."""
  tiny_config.model.attention = attention
  if attention == "switchhead":
    tiny_config.model.update(attention_experts=4, attention_k=2)
  tiny_config.train.update(steps=4, ckpt_every=2)
  whole, resumed = str(tmp_path / "whole"), str(tmp_path / "resumed")
  train_and_evaluate(tiny_config, whole)
  with monkeypatch.context() as m:
    patch_step(m, sigterm_at(1))
    assert train_and_evaluate(tiny_config, resumed)["step"] == 2
  assert train_and_evaluate(tiny_config, resumed)["step"] == 4
  jax.tree.map(np.testing.assert_array_equal, saved_item(whole, 4), saved_item(resumed, 4))


def test_a_config_saved_before_switchhead_existed_resumes(tiny_config):
  """A resolved LM config without SwitchHead's fields (saved before them) gets the values
  that rebuild what it trained, so resuming it finds no change."""
  current = LanguageModelTask(tiny_config).resolved_config()
  saved = copy.deepcopy(current)
  with saved.model.unlocked():
    for name in ("attention_experts", "attention_k", "attention_impl"):
      del saved.model[name]
  with pytest.raises(ConfigError, match="model.attention_impl"):
    resume_config.check_resumable(saved, current, workdir="w", step=1)
  upgraded = resume_config.with_fields_added_since(saved)
  assert resume_config.check_resumable(upgraded, current, workdir="w", step=1) == {}


def test_a_config_saved_before_embed_init_existed_resumes_as_the_n01_embedding(tiny_config):
  """A saved LM config without `embed_init` trained N(0, 1) embeddings, the only kind then:
  it resumes as "normal" (refused with today's default, resumable when the run says so)."""
  current = LanguageModelTask(tiny_config).resolved_config()
  saved = copy.deepcopy(current)
  with saved.model.unlocked():
    del saved.model["embed_init"]
  upgraded = resume_config.with_fields_added_since(saved)
  assert upgraded.model.embed_init == "normal" and current.model.embed_init == "fan_in"
  with pytest.raises(ConfigError, match="model.embed_init: 'normal' in the checkpoint"):
    resume_config.check_resumable(upgraded, current, workdir="w", step=1)
  with current.model.unlocked():
    current.model.embed_init = "normal"
  assert resume_config.check_resumable(upgraded, current, workdir="w", step=1) == {}
