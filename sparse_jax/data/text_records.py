"""Ordered TFDS records that hold one split of a text as a contiguous token stream.

Builders write a split as consecutive records in source order (with `disable_shuffling`), so
concatenating a split's records in order gives back its whole stream:
  - byte records `{"bytes": uint8[n]}`: consecutive fixed-size chunks of the raw bytes;
  - token records `{"tokens": uint[n], "words": int64}`: the SentencePiece ids of a batch of
    lines, and how many whitespace-separated words those lines hold (for per-word perplexity).
"""

import itertools
from typing import BinaryIO, Iterable, Iterator

import numpy as np
import tensorflow_datasets as tfds

from sparse_jax.data.sentencepiece_tokenizer import Tokenizer

BYTES_PER_RECORD = 1 << 20
LINES_PER_RECORD = 10_000


def byte_features() -> tfds.features.FeaturesDict:
  return tfds.features.FeaturesDict(
      {"bytes": tfds.features.Tensor(shape=(None,), dtype=np.uint8)})


def token_dtype(vocab_size: int) -> type:
  """The smallest unsigned type holding every id: half the disk of int32 for 8k pieces."""
  return np.uint16 if vocab_size <= 2**16 else np.uint32


def token_features(vocab_size: int) -> tfds.features.FeaturesDict:
  return tfds.features.FeaturesDict({
      "tokens": tfds.features.Tensor(shape=(None,), dtype=token_dtype(vocab_size)),
      "words": tfds.features.Scalar(dtype=np.int64),
  })


def read_exactly(f: BinaryIO, n_bytes: int, chunk_bytes: int = BYTES_PER_RECORD
                 ) -> Iterator[bytes]:
  """The next `n_bytes` of `f` in chunks of at most `chunk_bytes`; refuses a short read."""
  left = n_bytes
  while left:
    chunk = f.read(min(chunk_bytes, left))
    if not chunk:
      raise EOFError(f"source ended {left} bytes before the expected {n_bytes}.")
    left -= len(chunk)
    yield chunk


def byte_records(chunks: Iterable[bytes]) -> Iterator[tuple[int, dict]]:
  """One record per chunk, keyed by position."""
  for index, chunk in enumerate(chunks):
    yield index, {"bytes": np.frombuffer(chunk, dtype=np.uint8)}


def token_records(lines: Iterable[str], tokenizer: Tokenizer, vocab_size: int,
                  lines_per_record: int = LINES_PER_RECORD) -> Iterator[tuple[int, dict]]:
  """One record per batch of `lines_per_record` lines (newlines kept), keyed by position."""
  lines = iter(lines)
  for index in itertools.count():
    batch = list(itertools.islice(lines, lines_per_record))
    if not batch:
      return
    yield index, {"tokens": tokenizer.encode_lines(batch).astype(token_dtype(vocab_size)),
                  "words": sum(len(line.split()) for line in batch)}

