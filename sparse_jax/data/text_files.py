"""TFDS builder `text_files`: the user's own text as a byte or SentencePiece token stream.

Sources: three files (train, validation, test), or one file cut into consecutive parts by
`split_fractions`, each cut moved forward to the next line break so no line is split.
`tokenizer="bytes"`: the 256 byte values, metric bits per byte. `tokenizer="sentencepiece"`:
a model of `vocab_size` pieces trained on the train part and saved with the prepared data,
metric perplexity per token and per word. Records keep the file order. The TFDS config name
holds the tokenizer and a digest of the sources (absolute path, size, modification time) and
fractions, so editing or replacing a file prepares the data anew instead of reusing stale records.
"""

import hashlib
import os

import tensorflow_datasets as tfds

from sparse_jax.data import sentencepiece_tokenizer, sources, text_records

TOKENIZERS = ("bytes", "sentencepiece")
SPLIT_NAMES = ("train", "validation", "test")


def cut_at_line_breaks(data: bytes, fractions: tuple[float, ...]) -> list[bytes]:
  """`data` cut into consecutive parts of about `fractions` of its length, at line breaks."""
  parts, start, cumulative = [], 0, 0.0
  for fraction in fractions[:-1]:
    cumulative += fraction
    newline = data.find(b"\n", max(start, round(cumulative * len(data)) - 1))
    end = len(data) if newline < 0 else newline + 1
    parts.append(data[start:end])
    start = end
  return parts + [data[start:]]


# Leading bytes of the compressed formats a text file is most often mistaken for.
_ARCHIVES = {b"\x1f\x8b": "gzip", b"PK\x03\x04": "zip", b"BZh": "bzip2",
             b"\xfd7zXZ\x00": "xz", b"\x28\xb5\x2f\xfd": "zstd"}


def _read(path: str, field: str) -> bytes:
  """The bytes of `path` (config field `data.<field>`), refused if they are not text."""
  if not os.path.isfile(path):
    raise sources.MissingSourceError(
        f"text_files: {path!r} (config field data.{field}) does not exist.")
  with open(path, "rb") as f:
    data = f.read()
  for magic, kind in _ARCHIVES.items():
    if data.startswith(magic):
      raise sources.BadSourceError(
          f"text_files: {path!r} (data.{field}) is a {kind} archive, not text; decompress it "
          "and give the text file.")
  nul = data.find(b"\x00")
  if nul >= 0:
    raise sources.BadSourceError(
        f"text_files: {path!r} (data.{field}) is binary (NUL byte at offset {nul}); "
        "text_files reads text.")
  return data


def _decode(data: bytes, where: str) -> str:
  try:
    return data.decode("utf-8")
  except UnicodeDecodeError as e:
    raise sources.BadSourceError(
        f"text_files: {where} is not UTF-8 (byte {e.start}: {e.reason}); SentencePiece needs "
        "UTF-8 text: convert it (e.g. `iconv -t utf-8`), or use data.tokenizer='bytes', which "
        "reads any bytes.") from e


class TextFiles(tfds.core.GeneratorBasedBuilder):
  """Text files from the user, split by file or by fractions of one file."""

  VERSION = tfds.core.Version("1.0.0")
  RELEASE_NOTES = {"1.0.0": "User text files as byte or SentencePiece records."}

  def __init__(self, *, train_file: str | None = None, validation_file: str | None = None,
               test_file: str | None = None, file: str | None = None,
               split_fractions: tuple[float, float, float] = (0.9, 0.05, 0.05),
               tokenizer: str = "bytes",
               vocab_size: int = sentencepiece_tokenizer.DEFAULT_VOCAB_SIZE, **kwargs):
    """Either the three split files or `file` with `split_fractions` (train, valid, test)."""
    split_files = (train_file, validation_file, test_file)
    if not file and not all(split_files):
      raise ValueError("text_files: give train_file, validation_file and test_file, or file "
                       "with split_fractions.")
    if file:
      self._sources = {"file": os.path.abspath(file)}
    else:
      self._sources = {f"{split}_file": os.path.abspath(path) for split, path in
                       zip(SPLIT_NAMES, split_files)}
    self._fractions = tuple(split_fractions) if file else None
    self._tokenizer, self._vocab_size = tokenizer, vocab_size
    super().__init__(config=tfds.core.BuilderConfig(name=self._config_name()), **kwargs)

  def _config_name(self) -> str:
    """The tokenizer plus a digest of what the records are made from."""
    identity = [self._tokenizer, self._vocab_size, self._fractions]
    for field, path in sorted(self._sources.items()):
      stat = os.stat(path) if os.path.isfile(path) else None
      identity.append((field, path, stat and (stat.st_size, stat.st_mtime_ns)))
    digest = hashlib.sha256(repr(identity).encode()).hexdigest()[:12]
    kind = "bytes" if self._tokenizer == "bytes" else f"sp{self._vocab_size}"
    return f"{kind}_{digest}"

  def _info(self) -> tfds.core.DatasetInfo:
    features = (text_records.byte_features() if self._tokenizer == "bytes"
                else text_records.token_features(self._vocab_size))
    return tfds.core.DatasetInfo(builder=self, description=__doc__, features=features,
                                 disable_shuffling=True)

  def _where(self, split: str) -> str:
    """Where a split's text comes from, for messages."""
    if self._fractions:
      return (f"the {split} part of {self._sources['file']!r} (data.split_fractions="
              f"{self._fractions})")
    return f"{self._sources[f'{split}_file']!r} (data.{split}_file)"

  def _split_bytes(self) -> dict[str, bytes]:
    """Each split's bytes; an empty split is refused, naming its source."""
    if self._fractions:
      parts = cut_at_line_breaks(_read(self._sources["file"], "file"), self._fractions)
      data = dict(zip(SPLIT_NAMES, parts))
    else:
      data = {split: _read(self._sources[f"{split}_file"], f"{split}_file")
              for split in SPLIT_NAMES}
    for split, part in data.items():
      if not part:
        hint = (" (cuts move to the next line break: the text needs line breaks)"
                if self._fractions else "")
        raise sources.BadSourceError(f"text_files: {self._where(split)} is empty{hint}.")
    return data

  def _split_generators(self, dl_manager):
    del dl_manager  # The user's files are local.
    data = self._split_bytes()
    if self._tokenizer == "bytes":
      return {split: self._byte_examples(part) for split, part in data.items()}
    lines = {split: _decode(part, self._where(split)).splitlines(keepends=True)
             for split, part in data.items()}
    tokenizer = sentencepiece_tokenizer.train(
        lines["train"], self._vocab_size,
        sentencepiece_tokenizer.model_path(os.fspath(self.data_dir)))
    return {split: self._generate_examples(part, tokenizer) for split, part in lines.items()}

  def _byte_examples(self, data: bytes):
    chunks = (data[i:i + text_records.BYTES_PER_RECORD]
              for i in range(0, len(data), text_records.BYTES_PER_RECORD))
    yield from text_records.byte_records(chunks)

  def _generate_examples(self, lines: list[str], tokenizer):
    yield from text_records.token_records(lines, tokenizer, self._vocab_size)
