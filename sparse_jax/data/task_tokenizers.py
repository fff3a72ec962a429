"""Tokenizers that turn a classification example's one or two texts into a fixed-length row.

`encode(texts, max_len) -> (tokens [N, max_len] int32, lengths [N] int32)` where `texts` is a
tuple of one or two equally long lists (str or bytes). Rows are padded after `lengths`.

- `RobertaTokenizer`: RoBERTa's byte-level BPE from a Hugging Face directory (`tokenizer.json`,
  or `vocab.json` + `merges.txt`), through the `tokenizers` library: `<s> A </s>` or
  `<s> A </s></s> B </s>`, longest-first truncation, padded with `<pad>`.
- `ByteTokenizer`: raw UTF-8 bytes for the byte-level LMs `train.py` pretrains; a pair is
  joined by a newline; truncated to `max_len` and padded with 0 (`lengths` marks the end).
"""

import os

import numpy as np

VOCAB_FILE, MERGES_FILE, TOKENIZER_FILE = "vocab.json", "merges.txt", "tokenizer.json"


def _as_bytes(text) -> bytes:
  return text if isinstance(text, bytes) else text.encode("utf-8")


def _pad_rows(rows: list[list[int]], max_len: int, pad_id: int):
  tokens = np.full((len(rows), max_len), pad_id, np.int32)
  lengths = np.array([len(row) for row in rows], np.int32)
  for i, row in enumerate(rows):
    tokens[i, :len(row)] = row
  return tokens, lengths


class ByteTokenizer:
  """Bytes as tokens (vocabulary 256); see the module docstring."""

  vocab_size, pad_id = 256, 0

  def encode(self, texts: tuple[list, ...], max_len: int):
    rows = [list(b"\n".join(_as_bytes(t) for t in example)[:max_len])
            for example in zip(*texts)]
    return _pad_rows(rows, max_len, self.pad_id)


class RobertaTokenizer:
  """RoBERTa's tokenizer from a local Hugging Face directory; see the module docstring."""

  def __init__(self, path: str):
    import tokenizers  # Imported here: only RoBERTa backbones need it.

    tokenizer_file = os.path.join(path, TOKENIZER_FILE)
    vocab, merges = os.path.join(path, VOCAB_FILE), os.path.join(path, MERGES_FILE)
    if os.path.isfile(tokenizer_file):
      self._tokenizer = tokenizers.Tokenizer.from_file(tokenizer_file)
    elif os.path.isfile(vocab) and os.path.isfile(merges):
      self._tokenizer = tokenizers.Tokenizer(tokenizers.models.BPE.from_file(vocab, merges))
      self._tokenizer.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(
          add_prefix_space=False)
      self._tokenizer.decoder = tokenizers.decoders.ByteLevel()
    else:
      raise FileNotFoundError(
          f"no RoBERTa tokenizer in {path}: expected {TOKENIZER_FILE}, or {VOCAB_FILE} and "
          f"{MERGES_FILE} (as saved by Hugging Face `save_pretrained`).")
    self._tokenizer.no_padding()
    self.vocab_size = self._tokenizer.get_vocab_size()
    self.pad_id = self._id("<pad>")
    self._tokenizer.post_processor = tokenizers.processors.RobertaProcessing(
        ("</s>", self._id("</s>")), ("<s>", self._id("<s>")))  # (sep, cls), positional only.

  def _id(self, token: str) -> int:
    token_id = self._tokenizer.token_to_id(token)
    if token_id is None:
      raise ValueError(f"the tokenizer has no {token!r} token: not a RoBERTa vocabulary.")
    return token_id

  def encode(self, texts: tuple[list, ...], max_len: int):
    self._tokenizer.enable_truncation(max_len, strategy="longest_first")
    as_str = [[t.decode("utf-8", "replace") if isinstance(t, bytes) else t for t in field]
              for field in texts]
    inputs = as_str[0] if len(as_str) == 1 else list(zip(*as_str))
    encodings = self._tokenizer.encode_batch(inputs)
    return _pad_rows([e.ids for e in encodings], max_len, self.pad_id)
