"""Which task a config selects.

A config with a `task` section fine-tunes a classifier (`ClassificationTask`), one whose
`model.kind` is "terraformer" trains sequence to sequence (`Seq2SeqTask`); any other is
language modelling (`LanguageModelTask`). A new kind of task is a new module in `tasks/` and
one line in `task_class`.
"""

import ml_collections

from sparse_jax import schema
from sparse_jax.tasks.classification import ClassificationTask
from sparse_jax.tasks.lm import LanguageModelTask
from sparse_jax.tasks.seq2seq import Seq2SeqTask
from sparse_jax.training.task import Task


def task_class(config: ml_collections.ConfigDict) -> type[Task]:
  """Classification for a config with a `task` section, sequence to sequence for a
  Terraformer `model`, else language modelling."""
  if "task" in config:
    return ClassificationTask
  model = config.get("model")
  if model is not None and model.get("kind") == "terraformer":
    return Seq2SeqTask
  return LanguageModelTask


def validate_config(config: ml_collections.ConfigDict) -> schema.Schema:
  """The typed experiment config: every section parsed and checked before anything is
  prepared or built (raises `ConfigError` naming the first bad field; touches no file)."""
  return task_class(config).experiment.parse(config, "")


def task_for(config: ml_collections.ConfigDict) -> Task:
  """The task of `config`, its config validated (`validate_config`)."""
  return task_class(config)(config)

