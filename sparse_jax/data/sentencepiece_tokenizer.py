"""A SentencePiece tokenizer that turns text into a token stream and back, byte for byte.

Trained on a dataset's train split and stored next to the prepared data
(`MODEL_FILENAME` in the builder's data dir), so every later run reuses the same vocabulary.
Settings chosen for language modelling on contiguous streams:
  - identity normalisation, no whitespace clean-up and no dummy prefix: decoding the ids of a
    whole split gives back exactly its text, so streams made of many encoded lines join up;
  - the newline is its own piece, so line structure is kept in the stream;
  - byte fallback: characters outside the vocabulary become their UTF-8 bytes instead of
    `<unk>`, which keeps the round trip exact and the perplexity honest (this costs 256 ids,
    hence `MIN_VOCAB_SIZE`);
  - `hard_vocab_limit=False`: a small corpus may give fewer pieces than asked for.
"""

import io
import itertools
import os
from typing import Iterable, Sequence

import numpy as np
import sentencepiece as spm

MODEL_FILENAME = "sentencepiece.model"
NEWLINE = "\n"
DEFAULT_VOCAB_SIZE = 8000  # The paper's WikiText-103 runs.
MIN_VOCAB_SIZE = 320  # 256 byte pieces + <unk>, <s>, </s>, newline + room for characters.
MAX_TRAINING_LINES = 1_000_000  # A random sample of this many lines trains the model.


def model_path(directory: str) -> str:
  """Where a prepared dataset keeps its tokenizer: inside its TFDS data dir."""
  return os.path.join(directory, MODEL_FILENAME)


def train(lines: Iterable[str], vocab_size: int, path: str) -> "Tokenizer":
  """Trains on `lines` (newlines stripped, blank lines skipped), saves the model to `path`."""
  sentences = (line.rstrip(NEWLINE) for line in lines if line.strip())
  model = io.BytesIO()
  spm.SentencePieceTrainer.train(
      sentence_iterator=sentences, model_writer=model, vocab_size=vocab_size,
      model_type="unigram", normalization_rule_name="identity", remove_extra_whitespaces=False,
      add_dummy_prefix=False, byte_fallback=True, user_defined_symbols=[NEWLINE],
      hard_vocab_limit=False, input_sentence_size=MAX_TRAINING_LINES,
      shuffle_input_sentence=True, num_threads=os.cpu_count() or 1, minloglevel=2)
  with open(path, "wb") as f:
    f.write(model.getvalue())
  return Tokenizer(path)


class Tokenizer:
  """Encodes batches of lines into one id stream; decodes an id stream to text."""

  def __init__(self, path: str):
    if not os.path.isfile(path):
      raise FileNotFoundError(f"no SentencePiece model at {path!r}: prepare the dataset "
                              "first (it trains the tokenizer on the train split).")
    self._processor = spm.SentencePieceProcessor(model_file=path)

  @property
  def vocab_size(self) -> int:
    return self._processor.get_piece_size()

  def encode_lines(self, lines: Sequence[str]) -> np.ndarray:
    """The ids of `lines` (newlines included) concatenated in order, encoded in parallel."""
    ids_per_line = self._processor.encode(list(lines), num_threads=os.cpu_count() or 1)
    n = sum(len(ids) for ids in ids_per_line)
    return np.fromiter(itertools.chain.from_iterable(ids_per_line), np.int32, n)

  def decode(self, ids: Sequence[int] | np.ndarray) -> str:
    return self._processor.decode(np.asarray(ids).tolist())
