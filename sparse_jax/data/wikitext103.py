"""TFDS builder `wikitext103`: WikiText-103 raw text as a SentencePiece token stream.

Source: the official raw archive `wikitext-103-raw-v1.zip`, whose files are
`wikitext-103-raw/wiki.{train,valid,test}.raw`, found in TFDS `manual_dir` or downloaded from
`URL`; or an already-extracted directory holding the three `.raw` files (`source_dir`). A
SentencePiece model of `vocab_size` pieces (8000 in the paper's runs) is trained on the train
split and saved in the prepared data dir; each split is written as records of encoded lines in
source order, with word counts for per-word perplexity. Each vocabulary size is its own TFDS
config (`sp8000`, ...), so preparing another size does not overwrite the first; a config name
`sp<N>` also selects the size (`tfds build wikitext103/sp4000`, `tfds.builder(...)`).
"""

import contextlib
import io
import os
import re
import zipfile
from typing import Iterator, TextIO

import tensorflow_datasets as tfds

from sparse_jax.data import sentencepiece_tokenizer, sources, text_records

URL = "https://wikitext.smerity.com/wikitext-103-raw-v1.zip"
ARCHIVE = "wikitext-103-raw-v1.zip"
ARCHIVE_DIR = "wikitext-103-raw"
FILES = {"train": "wiki.train.raw", "validation": "wiki.valid.raw", "test": "wiki.test.raw"}


def check_source(source: str) -> None:
  """Refuses a directory or archive that lacks one of the three split files, naming it."""
  if os.path.isdir(source):
    missing = [name for name in FILES.values() if not os.path.isfile(os.path.join(source, name))]
    if missing:
      raise sources.MissingSourceError(
          f"wikitext103: {missing} not found in the extracted directory {source!r} "
          f"(config field data.source_dir); it must hold {sorted(FILES.values())}.")
    return
  try:
    with zipfile.ZipFile(source) as archive:
      names = set(archive.namelist())
  except zipfile.BadZipFile as e:
    raise sources.BadSourceError(
        f"wikitext103: {source!r} is not a complete zip archive ({e}); re-download it from "
        f"{URL}.") from e
  missing = [f"{ARCHIVE_DIR}/{name}" for name in FILES.values()
             if f"{ARCHIVE_DIR}/{name}" not in names]
  if missing:
    raise sources.BadSourceError(
        f"wikitext103: archive {source!r} lacks {missing}; expected the raw archive from {URL}.")


@contextlib.contextmanager
def open_split(source: str, split: str) -> Iterator[TextIO]:
  """The text of `split` from an extracted directory or the zip, newlines untranslated."""
  if os.path.isdir(source):
    with open(os.path.join(source, FILES[split]), encoding="utf-8", newline="") as f:
      yield f
    return
  with zipfile.ZipFile(source) as archive, archive.open(f"{ARCHIVE_DIR}/{FILES[split]}") as raw:
    yield io.TextIOWrapper(raw, encoding="utf-8", newline="")


def _builder_config(vocab_size: int) -> tfds.core.BuilderConfig:
  return tfds.core.BuilderConfig(name=f"sp{vocab_size}",
                                 description=f"SentencePiece, {vocab_size} pieces.")


def vocab_size_of(config: str | tfds.core.BuilderConfig) -> int:
  """The vocabulary size a config names: `sp8000` -> 8000."""
  name = config if isinstance(config, str) else config.name
  match = re.fullmatch(r"sp([1-9][0-9]*)", name)
  if not match:
    raise ValueError(f"wikitext103: config {name!r} is not sp<vocab_size> (e.g. sp8000).")
  return int(match[1])


class Wikitext103(tfds.core.GeneratorBasedBuilder):
  """WikiText-103 (raw) encoded with a SentencePiece model trained on its train split."""

  VERSION = tfds.core.Version("1.0.0")
  RELEASE_NOTES = {"1.0.0": "Raw WikiText-103, SentencePiece ids per line batch, word counts."}
  MANUAL_DOWNLOAD_INSTRUCTIONS = f"Put {ARCHIVE} (from {URL}) into the manual_dir."
  # The paper's size, what `tfds build wikitext103` prepares; any other `sp<N>` is accepted.
  BUILDER_CONFIGS = [_builder_config(sentencepiece_tokenizer.DEFAULT_VOCAB_SIZE)]

  def __init__(self, *, vocab_size: int | None = None,
               config: str | tfds.core.BuilderConfig | None = None,
               source_dir: str | None = None, manual_dir: str | None = None,
               download: bool = True, file_format: str | None = sources.FILE_FORMAT,
               **kwargs):
    """`vocab_size` or a `config` named `sp<vocab_size>` (default: sp8000). `source_dir`,
    when given, is an extracted directory used instead of the archive. `manual_dir` None:
    TFDS's (`sources.resolve_manual_dir`)."""
    if config is not None:
      named = vocab_size_of(config)
      if vocab_size is not None and vocab_size != named:
        raise ValueError(f"wikitext103: vocab_size={vocab_size} contradicts config "
                         f"{f'sp{named}'!r}.")
      vocab_size = named
    if vocab_size is None:
      vocab_size = sentencepiece_tokenizer.DEFAULT_VOCAB_SIZE
    self._vocab_size, self._source_dir = vocab_size, source_dir
    self._manual_dir, self._download = manual_dir, download
    # TFDS accepts a config object named like one of BUILDER_CONFIGS only if it is that one.
    config = next((c for c in self.BUILDER_CONFIGS if c.name == f"sp{vocab_size}"),
                  None) or _builder_config(vocab_size)
    super().__init__(config=config, file_format=file_format, **kwargs)

  def _info(self) -> tfds.core.DatasetInfo:
    return tfds.core.DatasetInfo(builder=self, description=__doc__,
                                 features=text_records.token_features(self._vocab_size),
                                 homepage=URL, disable_shuffling=True)

  def _split_generators(self, dl_manager):
    source = self._source_dir or sources.locate(
        "wikitext103", ARCHIVE, manual_dir=self._manual_dir, url=URL, download=self._download,
        dl_manager=dl_manager)
    check_source(source)
    with open_split(source, "train") as lines:
      tokenizer = sentencepiece_tokenizer.train(
          lines, self._vocab_size, sentencepiece_tokenizer.model_path(os.fspath(self.data_dir)))
    return {split: self._generate_examples(source, split, tokenizer) for split in FILES}

  def _generate_examples(self, source: str, split: str, tokenizer):
    with open_split(source, split) as lines:
      yield from text_records.token_records(lines, tokenizer, self._vocab_size)
