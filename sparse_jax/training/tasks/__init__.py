"""The tasks the engine trains, each thin: what a config's sections select.

A config with a `task` section fine-tunes a classifier (`ClassificationTask`); any other is
language modelling (`LanguageModelTask`). A new kind of task (sequence-to-sequence) is a new
module here and one line in `task_for`.
"""

import ml_collections

from sparse_jax.training.task import Task
from sparse_jax.training.tasks.classification import ClassificationTask
from sparse_jax.training.tasks.lm import LanguageModelTask


def task_for(config: ml_collections.ConfigDict) -> Task:
  """The task of `config`, its config validated (raises `ConfigError` naming the field)."""
  if "task" in config:
    return ClassificationTask(config)
  return LanguageModelTask(config)


__all__ = ["ClassificationTask", "LanguageModelTask", "Task", "task_for"]
