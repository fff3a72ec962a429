"""Datasets by name: TFDS builders prepared as array_record and read without TensorFlow."""

import dataclasses
from typing import Callable

import ml_collections
import numpy as np
import tensorflow_datasets as tfds

from sparse_jax import validation
from sparse_jax.data.builtin import Builtin

SPLITS = ("train", "validation", "test")


@dataclasses.dataclass(frozen=True)
class DatasetSpec:
  """How to build a dataset and what its tokens are."""

  make_builder: Callable[[ml_collections.ConfigDict], tfds.core.DatasetBuilder]
  vocab_size: int
  unit: str  # "byte": report bits per byte; "token": report perplexity.


def _builtin_builder(cfg: ml_collections.ConfigDict) -> tfds.core.DatasetBuilder:
  return Builtin(source_root=cfg.get("source_root"), data_dir=cfg.get("data_dir"),
                 file_format="array_record")


DATASETS: dict[str, DatasetSpec] = {
    "builtin": DatasetSpec(_builtin_builder, vocab_size=256, unit="byte"),
}


def spec(cfg: ml_collections.ConfigDict) -> DatasetSpec:
  validation.require_choice(cfg.get("name"), "data.name", DATASETS)
  return DATASETS[cfg.name]


def load_tokens(cfg: ml_collections.ConfigDict, split: str) -> np.ndarray:
  """Prepares the dataset if needed and returns a split as one contiguous token array."""
  validation.require_choice(split, "split", SPLITS)
  builder = spec(cfg).make_builder(cfg)
  builder.download_and_prepare()
  source = builder.as_data_source(split)
  pieces = [np.asarray(source[i]["bytes"]) for i in range(len(source))]
  return np.concatenate(pieces) if pieces else np.zeros((0,), np.uint8)
