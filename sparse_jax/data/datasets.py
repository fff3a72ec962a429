"""Datasets by name: TFDS builders prepared as array_record and read without TensorFlow.

The `data` section is a tagged schema (`sparse_jax.schema`): `data.name` picks the dataset's
`DataConfig` subclass below, which holds that dataset's fields (types, ranges, defaults) and
makes its builder. `spec(cfg)` parses the section (raising `ConfigError` without touching
files, so a bad config fails before anything is prepared) and describes the dataset. Fields
every dataset has: `batch_size` and `seq_len` (the LM stream pipeline), `data_dir` (None: the
TFDS default). Datasets with a downloadable source also have `manual_dir` (None:
`<data_dir>/downloads/manual`) and `download`.
"""

import dataclasses
import os
from typing import Callable, Literal

import ml_collections
import numpy as np
import tensorflow_datasets as tfds

from sparse_jax import schema, validation
from sparse_jax.data import enwik8, sentencepiece_tokenizer, text_files, wikitext103
from sparse_jax.data.builtin import Builtin

SPLITS = ("train", "validation", "test")


@dataclasses.dataclass(frozen=True)
class DatasetSpec:
  """How to build a dataset and what its tokens are."""

  make_builder: Callable[[], tfds.core.DatasetBuilder]
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


class DataConfig(schema.Schema, tag="name"):
  """The `data` section: `name` picks the dataset's schema; the fields all datasets have."""

  name: str  # The dataset: builtin, enwik8, wikitext103, text_files (docs/datasets.md).
  batch_size: schema.PositiveInt  # Contiguous streams per batch.
  seq_len: schema.PositiveInt  # Tokens per segment.
  data_dir: str | None = None  # None: ~/tensorflow_datasets.

  def spec(self) -> DatasetSpec:
    raise NotImplementedError(f"{type(self).__name__} must define spec().")


@DataConfig.variant("builtin")
class BuiltinData(DataConfig):
  """This Python's standard library as bytes (no download)."""

  source_root: str | None = None  # None: this Python's standard library.

  def spec(self) -> DatasetSpec:
    return DatasetSpec(lambda: Builtin(source_root=self.source_root, data_dir=self.data_dir,
                                       file_format="array_record"), vocab_size=256, unit="byte")


class DownloadedData(DataConfig):
  """A dataset whose source is found in `manual_dir` or downloaded."""

  manual_dir: str | None = None  # None: <data_dir>/downloads/manual.
  download: bool = True  # Download the source when manual_dir lacks it (False: an error).

  def builder_args(self) -> dict:
    data_dir = self.data_dir or tfds.core.constants.DATA_DIR
    return {"manual_dir": self.manual_dir or os.path.join(data_dir, "downloads", "manual"),
            "download": self.download, "data_dir": self.data_dir,
            "file_format": "array_record"}


@DataConfig.variant("enwik8")
class Enwik8Data(DownloadedData):
  """Enwik8 bytes (`sparse_jax.data.enwik8`)."""

  # None: the standard 90M/5M/5M; else (train, validation, test) byte counts.
  split_bytes: tuple[schema.PositiveInt, schema.PositiveInt, schema.PositiveInt] | None = None

  def spec(self) -> DatasetSpec:
    split_bytes = (tuple(zip(SPLITS, self.split_bytes)) if self.split_bytes
                   else enwik8.STANDARD_SPLIT_BYTES)
    return DatasetSpec(lambda: enwik8.Enwik8(split_bytes=split_bytes, **self.builder_args()),
                       vocab_size=256, unit="byte")


def _check_sp_vocab_size(vocab_size: int, path: str) -> None:
  minimum = sentencepiece_tokenizer.MIN_VOCAB_SIZE
  validation.require(vocab_size >= minimum, f"{path}.sp_vocab_size", f"an integer >= {minimum}",
                     vocab_size)


@DataConfig.variant("wikitext103")
class Wikitext103Data(DownloadedData):
  """WikiText-103 as SentencePiece tokens (`sparse_jax.data.wikitext103`)."""

  source_dir: str | None = None  # An extracted wikitext-103-raw/ instead of the zip.
  # Pieces of the SentencePiece model trained on the train split.
  sp_vocab_size: int = sentencepiece_tokenizer.DEFAULT_VOCAB_SIZE

  def check(self, path: str) -> None:
    _check_sp_vocab_size(self.sp_vocab_size, path)

  def spec(self) -> DatasetSpec:
    return DatasetSpec(
        lambda: wikitext103.Wikitext103(vocab_size=self.sp_vocab_size,
                                        source_dir=self.source_dir, **self.builder_args()),
        vocab_size=self.sp_vocab_size, unit="token", feature="tokens")


@DataConfig.variant("text_files")
class TextFilesData(DataConfig):
  """The user's text files (`sparse_jax.data.text_files`): three split files, or `file` cut
  by `split_fractions`."""

  train_file: str | None = None  # The train split's text (with the other two files).
  validation_file: str | None = None  # The validation split's text.
  test_file: str | None = None  # The test split's text.
  file: str | None = None  # One text cut into the three splits (instead of the three files).
  # file's train, validation and test fractions, in that order, summing to 1.
  split_fractions: tuple[schema.PositiveFloat, schema.PositiveFloat,
                         schema.PositiveFloat] | None = None
  tokenizer: Literal[text_files.TOKENIZERS] = "bytes"  # Bytes, or SentencePiece trained here.
  sp_vocab_size: int = sentencepiece_tokenizer.DEFAULT_VOCAB_SIZE  # tokenizer=sentencepiece.

  def check(self, path: str) -> None:
    split_files = (self.train_file, self.validation_file, self.test_file)
    if self.file:
      validation.require(not any(split_files), f"{path}.file",
                         f"unset when {path}.train_file/validation_file/test_file are set",
                         self.file)
      fractions = self.split_fractions
      validation.require(fractions is not None and abs(sum(fractions) - 1.0) < 1e-6,
                         f"{path}.split_fractions", "three positive fractions summing to 1",
                         fractions)
    else:  # Where the text is: needed to read it, not to build or compile the model.
      validation.require_data_source(
          all(split_files), f"{path}.train_file", f"set, with {path}.validation_file and "
          f"{path}.test_file (or set {path}.file and {path}.split_fractions)", split_files)
    if self.tokenizer == "sentencepiece":
      _check_sp_vocab_size(self.sp_vocab_size, path)

  def spec(self) -> DatasetSpec:
    byte_level = self.tokenizer == "bytes"
    vocab_size = 256 if byte_level else self.sp_vocab_size
    if self.file:
      sources = {"file": self.file, "split_fractions": self.split_fractions}
    else:
      sources = {"train_file": self.train_file, "validation_file": self.validation_file,
                 "test_file": self.test_file}

    def make():
      return text_files.TextFiles(**sources, tokenizer=self.tokenizer, vocab_size=vocab_size,
                                  data_dir=self.data_dir, file_format="array_record")

    if byte_level:
      return DatasetSpec(make, vocab_size=256, unit="byte")
    return DatasetSpec(make, vocab_size=vocab_size, unit="token", feature="tokens")


DATASETS: dict[str, type[DataConfig]] = DataConfig.variants()


def parse(cfg: ml_collections.ConfigDict | dict | DataConfig) -> DataConfig:
  """The typed `data` section, every field of its dataset checked (no file access)."""
  return DataConfig.parse(cfg, "data")


def spec(cfg: ml_collections.ConfigDict | dict | DataConfig) -> DatasetSpec:
  """The spec of the dataset `cfg.name`, after checking the section's fields."""
  return parse(cfg).spec()


def prepared_builder(cfg) -> tfds.core.DatasetBuilder:
  """The dataset's builder, prepared (once: later calls find the records in data_dir)."""
  builder = spec(cfg).make_builder()
  builder.download_and_prepare()
  return builder


def load_split(cfg, split: str) -> TokenSplit:
  """Prepares the dataset if needed and returns a split's tokens in order, and its words."""
  validation.require_choice(split, "split", SPLITS)
  data = parse(cfg)
  feature = data.spec().feature
  source = prepared_builder(data).as_data_source(split)
  records = [source[i] for i in range(len(source))]
  tokens = (np.concatenate([np.asarray(r[feature]) for r in records]) if records
            else np.zeros((0,), np.uint8))
  words = sum(int(r["words"]) for r in records) if feature == "tokens" else None
  return TokenSplit(tokens, words)


def load_tokens(cfg, split: str) -> np.ndarray:
  """Prepares the dataset if needed and returns a split as one contiguous token array."""
  return load_split(cfg, split).tokens


def load_tokenizer(cfg) -> sentencepiece_tokenizer.Tokenizer:
  """The SentencePiece model stored with a prepared token dataset (to decode its ids)."""
  data = parse(cfg)
  validation.require(data.spec().feature == "tokens", "data.name",
                     "a SentencePiece dataset to have a tokenizer", data.name)
  return sentencepiece_tokenizer.Tokenizer(
      sentencepiece_tokenizer.model_path(os.fspath(prepared_builder(data).data_dir)))
