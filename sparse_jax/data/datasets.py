"""Datasets by name: TFDS builders prepared as array_record and read without TensorFlow.

`DATASETS` maps `data.name` to a function of the `data` config section giving its
`DatasetSpec`; it validates that dataset's fields (raising `ConfigError`) without touching
files, so a bad config fails before anything is prepared. Config fields shared by the builders
with a downloadable source: `data_dir` (None: the TFDS default), `manual_dir` (None:
`<data_dir>/downloads/manual`) and `download` (default True).
"""

import dataclasses
import os
from typing import Callable

import ml_collections
import numpy as np
import tensorflow_datasets as tfds

from sparse_jax import validation
from sparse_jax.data import enwik8, sentencepiece_tokenizer, text_files, wikitext103
from sparse_jax.data.builtin import Builtin

SPLITS = ("train", "validation", "test")


@dataclasses.dataclass(frozen=True)
class DatasetSpec:
  """How to build a dataset and what its tokens are."""

  make_builder: Callable[[ml_collections.ConfigDict], tfds.core.DatasetBuilder]
  vocab_size: int
  unit: str  # "byte": report bits per byte; "token": report perplexity (and per word).
  feature: str = "bytes"  # The record field holding the tokens.


@dataclasses.dataclass(frozen=True)
class TokenSplit:
  """A split as one contiguous token array, and its whitespace-separated word count."""

  tokens: np.ndarray
  words: int | None  # None for byte-level datasets, which report bits per byte.

  @property
  def words_per_token(self) -> float | None:
    return self.words / len(self.tokens) if self.words and len(self.tokens) else None


def _manual_dir(cfg: ml_collections.ConfigDict) -> str:
  data_dir = cfg.get("data_dir") or tfds.core.constants.DATA_DIR
  return cfg.get("manual_dir") or os.path.join(data_dir, "downloads", "manual")


def _download_fields(cfg: ml_collections.ConfigDict) -> dict:
  """Builder arguments of the datasets whose source is found in manual_dir or downloaded."""
  download = cfg.get("download", True)
  validation.require(isinstance(download, bool), "data.download", "True or False", download)
  return {"manual_dir": _manual_dir(cfg), "download": download,
          "data_dir": cfg.get("data_dir"), "file_format": "array_record"}


def _sp_vocab_size(cfg: ml_collections.ConfigDict) -> int:
  vocab_size = cfg.get("sp_vocab_size", sentencepiece_tokenizer.DEFAULT_VOCAB_SIZE)
  validation.require(
      isinstance(vocab_size, int) and vocab_size >= sentencepiece_tokenizer.MIN_VOCAB_SIZE,
      "data.sp_vocab_size", f"an integer >= {sentencepiece_tokenizer.MIN_VOCAB_SIZE}",
      vocab_size)
  return vocab_size


def _builtin(cfg: ml_collections.ConfigDict) -> DatasetSpec:
  def make(cfg):
    return Builtin(source_root=cfg.get("source_root"), data_dir=cfg.get("data_dir"),
                   file_format="array_record")

  return DatasetSpec(make, vocab_size=256, unit="byte")


def _enwik8(cfg: ml_collections.ConfigDict) -> DatasetSpec:
  split_bytes = cfg.get("split_bytes")  # None: the standard 90M/5M/5M.
  validation.require(
      split_bytes is None or (len(split_bytes) == len(SPLITS) and all(
          isinstance(n, int) and n > 0 for n in split_bytes)),
      "data.split_bytes", "None (standard 90M/5M/5M) or three positive byte counts",
      split_bytes)
  _download_fields(cfg)  # Validates data.download.

  def make(cfg):
    custom = cfg.get("split_bytes")
    return enwik8.Enwik8(
        split_bytes=tuple(zip(SPLITS, custom)) if custom else enwik8.STANDARD_SPLIT_BYTES,
        **_download_fields(cfg))

  return DatasetSpec(make, vocab_size=256, unit="byte")


def _wikitext103(cfg: ml_collections.ConfigDict) -> DatasetSpec:
  _download_fields(cfg)  # Validates data.download.

  def make(cfg):
    return wikitext103.Wikitext103(vocab_size=_sp_vocab_size(cfg),
                                   source_dir=cfg.get("source_dir"), **_download_fields(cfg))

  return DatasetSpec(make, vocab_size=_sp_vocab_size(cfg), unit="token", feature="tokens")


def _text_files(cfg: ml_collections.ConfigDict) -> DatasetSpec:
  tokenizer = cfg.get("tokenizer", "bytes")
  validation.require_choice(tokenizer, "data.tokenizer", text_files.TOKENIZERS)
  split_files = [cfg.get(f"{split}_file") for split in SPLITS]
  if cfg.get("file"):
    validation.require(not any(split_files), "data.file",
                       "unset when data.train_file/validation_file/test_file are set",
                       cfg.file)
    fractions = cfg.get("split_fractions")
    validation.require(
        fractions is not None and len(fractions) == len(SPLITS)
        and all(isinstance(f, (int, float)) and f > 0 for f in fractions)
        and abs(sum(fractions) - 1.0) < 1e-6,
        "data.split_fractions", "three positive fractions summing to 1", fractions)
  else:
    validation.require(all(split_files), "data.train_file",
                       "set, with data.validation_file and data.test_file (or set data.file "
                       "and data.split_fractions)", split_files)

  def make(cfg):
    return text_files.TextFiles(
        **{f"{split}_file": cfg.get(f"{split}_file") for split in SPLITS},
        file=cfg.get("file"), split_fractions=tuple(cfg.get("split_fractions") or ()),
        tokenizer=tokenizer, vocab_size=_sp_vocab_size(cfg) if tokenizer != "bytes" else 256,
        data_dir=cfg.get("data_dir"), file_format="array_record")

  if tokenizer == "bytes":
    return DatasetSpec(make, vocab_size=256, unit="byte")
  return DatasetSpec(make, vocab_size=_sp_vocab_size(cfg), unit="token", feature="tokens")


DATASETS: dict[str, Callable[[ml_collections.ConfigDict], DatasetSpec]] = {
    "builtin": _builtin,
    "enwik8": _enwik8,
    "wikitext103": _wikitext103,
    "text_files": _text_files,
}


def spec(cfg: ml_collections.ConfigDict) -> DatasetSpec:
  """The spec of `cfg.name`, after checking that dataset's config fields."""
  validation.require_choice(cfg.get("name"), "data.name", DATASETS)
  return DATASETS[cfg.name](cfg)


def prepared_builder(cfg: ml_collections.ConfigDict) -> tfds.core.DatasetBuilder:
  """The dataset's builder, prepared (once: later calls find the records in data_dir)."""
  builder = spec(cfg).make_builder(cfg)
  builder.download_and_prepare()
  return builder


def load_split(cfg: ml_collections.ConfigDict, split: str) -> TokenSplit:
  """Prepares the dataset if needed and returns a split's tokens in order, and its words."""
  validation.require_choice(split, "split", SPLITS)
  feature = spec(cfg).feature
  source = prepared_builder(cfg).as_data_source(split)
  records = [source[i] for i in range(len(source))]
  tokens = (np.concatenate([np.asarray(r[feature]) for r in records]) if records
            else np.zeros((0,), np.uint8))
  words = sum(int(r["words"]) for r in records) if feature == "tokens" else None
  return TokenSplit(tokens, words)


def load_tokens(cfg: ml_collections.ConfigDict, split: str) -> np.ndarray:
  """Prepares the dataset if needed and returns a split as one contiguous token array."""
  return load_split(cfg, split).tokens


def load_tokenizer(cfg: ml_collections.ConfigDict) -> sentencepiece_tokenizer.Tokenizer:
  """The SentencePiece model stored with a prepared token dataset (to decode its ids)."""
  validation.require(spec(cfg).feature == "tokens", "data.name",
                     "a SentencePiece dataset to have a tokenizer", cfg.get("name"))
  return sentencepiece_tokenizer.Tokenizer(
      sentencepiece_tokenizer.model_path(os.fspath(prepared_builder(cfg).data_dir)))
