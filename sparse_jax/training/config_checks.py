"""Validation of a whole language-model experiment config, before anything is built or
downloaded."""

import jax
import ml_collections

from sparse_jax import data, parallel, validation
from sparse_jax.models.lm import validate_model_config
from sparse_jax.training.optimizer import validate_train_config


def validate_config(config: ml_collections.ConfigDict) -> None:
  """Raises `ConfigError` naming the first bad field of the experiment config."""
  for section in ("data", "model", "train", "eval"):
    validation.require(section in config, section, "a config section", None)
  validation.require(isinstance(config.get("seed"), int), "seed", "an integer",
                     config.get("seed"))
  dataset = data.spec(config.data)
  validation.require_positive_int(config.data.get("batch_size"), "data.batch_size")
  validation.require_positive_int(config.data.get("seq_len"), "data.seq_len")
  validate_model_config(config.model)
  validation.require(config.model.vocab_size >= dataset.vocab_size, "model.vocab_size",
                     f">= the vocabulary of data.name={config.data.name!r} "
                     f"({dataset.vocab_size})", config.model.vocab_size)
  validate_train_config(config.train)
  validation.require_positive_int(config.eval.get("batch_size"), "eval.batch_size")
  mem_len = config.eval.get("mem_len")
  validation.require(isinstance(mem_len, int) and mem_len >= 0, "eval.mem_len",
                     "an integer >= 0", mem_len)
  max_batches = config.eval.get("max_batches")
  validation.require(max_batches is None or (isinstance(max_batches, int) and max_batches > 0),
                     "eval.max_batches", "a positive integer or None (the whole split)",
                     max_batches)
  validate_mesh(config)


def validate_mesh(config: ml_collections.ConfigDict) -> None:
  """The `mesh` section's sizes are valid and fit this job's devices (the batch and expert
  counts are checked against the actual mesh by the task's `check_mesh`)."""
  parallel.mesh_shape(config.get("mesh", {}), jax.device_count())
