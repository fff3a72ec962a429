"""The tasks the engine trains, each thin: what a config's sections select.

A config with a `task` section fine-tunes a classifier (`ClassificationTask`); any other is
language modelling (`LanguageModelTask`). A new kind of task (sequence-to-sequence) is a new
module here and one line in `task_for`.
"""

import ml_collections

from sparse_jax import schema
from sparse_jax.training.task import Task
from sparse_jax.training.tasks.classification import ClassificationTask
from sparse_jax.training.tasks.lm import LanguageModelTask


def task_class(config: ml_collections.ConfigDict) -> type[Task]:
  """Classification for a config with a `task` section, else language modelling."""
  return ClassificationTask if "task" in config else LanguageModelTask


def validate_config(config: ml_collections.ConfigDict) -> schema.Schema:
  """The typed experiment config: every section parsed and checked before anything is
  prepared or built (raises `ConfigError` naming the first bad field; touches no file)."""
  return task_class(config).experiment.parse(config, "")


def task_for(config: ml_collections.ConfigDict) -> Task:
  """The task of `config`, its config validated (`validate_config`)."""
  return task_class(config)(config)


__all__ = ["ClassificationTask", "LanguageModelTask", "Task", "task_class", "task_for",
           "validate_config"]
