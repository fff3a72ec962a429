"""TFDS builder `builtin`: the running Python's standard library as a byte corpus.

The embedded default dataset: it needs no download, because every Python ships it. Each
example is one `.py` file of the standard library (the `pydoc_data` topics included), as raw
bytes. Files are assigned to train/validation/test (90/5/5) by a stable hash of their path
relative to the library root, so the split does not depend on the order of a directory listing
or on the machine. Examples keep a sorted path order (`disable_shuffling`), so a split read in
order is a reproducible, contiguous text.
"""

import hashlib
import os
import sysconfig

import numpy as np
import tensorflow_datasets as tfds

from sparse_jax.data import sources

SPLIT_FRACTIONS = (("train", 0.90), ("validation", 0.05), ("test", 0.05))
_SKIPPED_DIRS = frozenset({"site-packages", "dist-packages", "__pycache__"})


def stdlib_root() -> str:
  """The directory of the running Python's pure-Python standard library."""
  return sysconfig.get_paths()["stdlib"]


def split_of(relative_path: str) -> str:
  """Assigns a file to a split by a stable hash of its relative path (90/5/5)."""
  digest = hashlib.sha256(relative_path.encode("utf-8")).digest()
  u = int.from_bytes(digest[:8], "big") / 2.0**64
  for split, fraction in SPLIT_FRACTIONS:
    if u < fraction:
      return split
    u -= fraction
  return SPLIT_FRACTIONS[-1][0]


def list_sources(root: str) -> list[str]:
  """Sorted relative paths of the `.py` files under `root`, skipping installed packages."""
  paths = []
  for directory, subdirs, files in os.walk(root):
    subdirs[:] = sorted(d for d in subdirs if d not in _SKIPPED_DIRS)
    for name in files:
      if name.endswith(".py"):
        paths.append(os.path.relpath(os.path.join(directory, name), root))
  return sorted(paths)


class Builtin(tfds.core.GeneratorBasedBuilder):
  """The running Python's standard-library sources as bytes, one example per file."""

  VERSION = tfds.core.Version("1.0.0")
  RELEASE_NOTES = {"1.0.0": "Standard-library .py files split 90/5/5 by path hash."}

  def __init__(self, *, source_root: str | None = None, **kwargs):
    """`source_root` defaults to the running interpreter's standard library."""
    self._source_root = source_root or stdlib_root()
    super().__init__(**kwargs)

  def _info(self) -> tfds.core.DatasetInfo:
    return tfds.core.DatasetInfo(
        builder=self,
        description=__doc__,
        features=tfds.features.FeaturesDict({
            "path": tfds.features.Text(),
            "bytes": tfds.features.Tensor(shape=(None,), dtype=np.uint8),
        }),
        disable_shuffling=True,
    )

  def _split_generators(self, dl_manager):
    del dl_manager  # Nothing to download.
    if not os.path.isdir(self._source_root):
      raise FileNotFoundError(
          f"builtin: standard-library directory {self._source_root!r} does not exist.")
    by_split = {split: [] for split, _ in SPLIT_FRACTIONS}
    for path in list_sources(self._source_root):
      by_split[split_of(path)].append(path)
    for split, paths in by_split.items():
      if not paths:
        raise sources.BadSourceError(
            f"builtin: none of the .py files under {self._source_root!r} falls into the {split} "
            f"split (files go to train/validation/test 90/5/5 by a hash of their path); use a "
            f"source root with more files (data.source_root, None: this Python's library).")
    return {split: self._generate_examples(paths) for split, paths in by_split.items()}

  def _generate_examples(self, relative_paths):
    for path in relative_paths:
      with open(os.path.join(self._source_root, path), "rb") as f:
        data = np.frombuffer(f.read(), dtype=np.uint8)
      yield path, {"path": path, "bytes": data}
