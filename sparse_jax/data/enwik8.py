"""TFDS builder `enwik8`: the first 10^8 bytes of an English Wikipedia XML dump, as bytes.

Source: the official `enwik8.zip` (Hutter Prize), found in TFDS `manual_dir` or downloaded
from `URL`. The standard split is by byte offset: the first 90,000,000 bytes are train, the
next 5,000,000 validation, the last 5,000,000 test. Each split is written as consecutive
chunks in source order (`disable_shuffling`), so a split read in order is exactly its byte
range. Vocabulary: the 256 byte values; the metric is bits per character (= per byte).
"""

import zipfile

import tensorflow_datasets as tfds

from sparse_jax.data import sources, text_records

URL = "http://mattmahoney.net/dc/enwik8.zip"
ARCHIVE = "enwik8.zip"
MEMBER = "enwik8"
STANDARD_SPLIT_BYTES = (("train", 90_000_000), ("validation", 5_000_000), ("test", 5_000_000))


def member_size(archive_path: str, expected: int) -> int:
  """Checks that `archive_path` is a zip whose `enwik8` member holds `expected` bytes."""
  try:
    with zipfile.ZipFile(archive_path) as archive:
      info = archive.getinfo(MEMBER)
  except (zipfile.BadZipFile, KeyError) as e:
    raise sources.BadSourceError(
        f"enwik8: {archive_path!r} is not a complete enwik8.zip holding the file "
        f"{MEMBER!r} ({e}); re-download it from {URL}.") from e
  if info.file_size != expected:
    raise sources.BadSourceError(
        f"enwik8: {MEMBER!r} in {archive_path!r} holds {info.file_size:,} bytes, expected "
        f"{expected:,}: the file is truncated or not enwik8; re-download it from {URL}.")
  return info.file_size


class Enwik8(tfds.core.GeneratorBasedBuilder):
  """enwik8 bytes split by offset into train/validation/test, in source order."""

  VERSION = tfds.core.Version("1.0.0")
  RELEASE_NOTES = {"1.0.0": "Standard 90M/5M/5M byte split of the official enwik8.zip."}
  MANUAL_DOWNLOAD_INSTRUCTIONS = f"Put {ARCHIVE} (from {URL}) into the manual_dir."

  def __init__(self, *, manual_dir: str | None = None, download: bool = True,
               split_bytes: tuple[tuple[str, int], ...] = STANDARD_SPLIT_BYTES,
               chunk_bytes: int = text_records.BYTES_PER_RECORD,
               file_format: str | None = sources.FILE_FORMAT, **kwargs):
    """`split_bytes`: (split, length) in source order; their sum is the required size.
    `manual_dir` None: TFDS's (`sources.resolve_manual_dir`)."""
    self._manual_dir, self._download = manual_dir, download
    self._split_bytes, self._chunk_bytes = tuple(split_bytes), chunk_bytes
    super().__init__(file_format=file_format, **kwargs)

  def _info(self) -> tfds.core.DatasetInfo:
    return tfds.core.DatasetInfo(builder=self, description=__doc__,
                                 features=text_records.byte_features(), homepage=URL,
                                 disable_shuffling=True)

  def _split_generators(self, dl_manager):
    path = sources.locate("enwik8", ARCHIVE, manual_dir=self._manual_dir, url=URL,
                          download=self._download, dl_manager=dl_manager)
    member_size(path, sum(n for _, n in self._split_bytes))
    generators, start = {}, 0
    for split, n_bytes in self._split_bytes:
      generators[split] = self._generate_examples(path, start, n_bytes)
      start += n_bytes
    return generators

  def _generate_examples(self, path: str, start: int, n_bytes: int):
    with zipfile.ZipFile(path) as archive, archive.open(MEMBER) as f:
      f.seek(start)
      yield from text_records.byte_records(text_records.read_exactly(f, n_bytes,
                                                                     self._chunk_bytes))
