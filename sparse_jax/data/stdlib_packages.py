"""TFDS builder `stdlib_packages`: which standard-library package a byte snippet comes from.

An offline classification task for fine-tuning the byte-level LMs trained on `builtin`: every
Python ships its data, so it needs no download. Each example is a `snippet_bytes` window of a
`.py` file under one of `packages` (top-level standard-library packages), labelled with the
package's index. Snippets are the non-overlapping windows of each file (the short tail is
dropped), at most `max_snippets_per_file` of them, evenly spaced, so a few huge files do not
dominate a class.

Files go to train/validation/test by `builtin.split_of` of their path relative to the library
root, the same assignment as `builtin`: an LM pretrained on `builtin`'s train split has never
seen the validation or test files of this task.

Dataset identity: the records depend on the packages, the snippet length, the per-file cap and
the source files, so each setting is its own `BuilderConfig`, named from the settings and a
digest of the selected files' paths and contents, e.g.
`asyncio+idlelib+multiprocessing+unittest-256b-max64-<digest>`. Records live under
`<data_dir>/stdlib_packages/<config name>/<version>`, so a changed setting or a different
Python's library is prepared anew instead of silently reusing old records. (TFDS logs
"Using custom data configuration" for it.) Writing shuffles the examples, deterministically:
the order depends only on the example keys (path and window index).
"""

import hashlib
import os

import numpy as np
import tensorflow_datasets as tfds

from sparse_jax.data import builtin

# Large pure-Python packages with distinct vocabularies that have at least 30 snippets (at the
# default settings) in both the validation and the test split on CPython 3.11, 3.12 and 3.13.
# (email has no test-split file; tkinter's validation split is empty from 3.12 on.)
DEFAULT_PACKAGES = ("asyncio", "idlelib", "multiprocessing", "unittest")
DEFAULT_SNIPPET_BYTES = 256
DEFAULT_MAX_SNIPPETS_PER_FILE = 64
SPLITS = tuple(split for split, _ in builtin.SPLIT_FRACTIONS)
_DIGEST_CHARS = 12


def package_sources(source_root: str, packages: tuple[str, ...]) -> list[str]:
  """Sorted relative paths of the `.py` files under each package directory of `source_root`."""
  if not os.path.isdir(source_root):
    raise FileNotFoundError(
        f"stdlib_packages: standard-library directory {source_root!r} does not exist.")
  paths = []
  for package in packages:
    package_dir = os.path.join(source_root, package)
    if not os.path.isdir(package_dir):
      raise FileNotFoundError(
          f"stdlib_packages: package directory {package_dir!r} does not exist; choose "
          f"packages present in {source_root!r}.")
    paths.extend(os.path.join(package, p) for p in builtin.list_sources(package_dir))
  return sorted(paths)


def snippet_starts(file_bytes: int, snippet_bytes: int, max_snippets: int) -> np.ndarray:
  """Byte offsets of a file's snippets: whole windows, at most `max_snippets`, evenly spaced.

  With more windows than `max_snippets`, the windows are cut into `max_snippets` equal blocks
  and each block gives its first whole window.
  """
  num_windows = file_bytes // snippet_bytes
  if num_windows <= max_snippets:
    windows = np.arange(num_windows)
  else:
    windows = -(-np.arange(max_snippets) * num_windows // max_snippets)  # Ceil division.
  return windows * snippet_bytes


def _sources_digest(source_root: str, paths: list[str]) -> str:
  """A digest of the selected files' relative paths and contents."""
  digest = hashlib.sha256()
  for path in paths:
    with open(os.path.join(source_root, path), "rb") as f:
      content = f.read()
    digest.update(f"{path}\0{len(content)}\0".encode("utf-8"))
    digest.update(content)
  return digest.hexdigest()[:_DIGEST_CHARS]


def _check_settings(packages, snippet_bytes, max_snippets_per_file) -> None:
  if not packages or not all(isinstance(p, str) and p.isidentifier() for p in packages):
    raise ValueError(f"stdlib_packages: packages must be package names; got {packages!r}.")
  if len(set(packages)) != len(packages):
    raise ValueError(f"stdlib_packages: packages must be distinct; got {packages!r}.")
  for name, value in (("snippet_bytes", snippet_bytes),
                      ("max_snippets_per_file", max_snippets_per_file)):
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
      raise ValueError(f"stdlib_packages: {name} must be a positive integer; got {value!r}.")


class StdlibPackages(tfds.core.GeneratorBasedBuilder):
  """Byte snippets of standard-library packages, labelled with their package."""

  VERSION = tfds.core.Version("1.0.0")
  RELEASE_NOTES = {"1.0.0": "Snippets of standard-library packages, split by builtin.split_of."}

  def __init__(self, *, source_root: str | None = None,
               packages: tuple[str, ...] = DEFAULT_PACKAGES,
               snippet_bytes: int = DEFAULT_SNIPPET_BYTES,
               max_snippets_per_file: int = DEFAULT_MAX_SNIPPETS_PER_FILE, **kwargs):
    """`source_root` defaults to the running interpreter's standard library.

    Lists and digests the selected files (a few MB) to name the config; raises
    FileNotFoundError if `source_root` or a package directory is missing.
    """
    packages = tuple(packages)
    _check_settings(packages, snippet_bytes, max_snippets_per_file)
    self._source_root = source_root or builtin.stdlib_root()
    self._packages = packages
    self._snippet_bytes = snippet_bytes
    self._max_snippets = max_snippets_per_file
    self._paths = package_sources(self._source_root, packages)
    name = (f"{'+'.join(packages)}-{snippet_bytes}b-max{max_snippets_per_file}-"
            f"{_sources_digest(self._source_root, self._paths)}")
    config = tfds.core.BuilderConfig(
        name=name, description=(f"packages {list(packages)}, {snippet_bytes}-byte snippets, at "
                                f"most {max_snippets_per_file} per file"))
    super().__init__(config=config, **kwargs)

  def _info(self) -> tfds.core.DatasetInfo:
    return tfds.core.DatasetInfo(
        builder=self,
        description=__doc__,
        features=tfds.features.FeaturesDict({
            "text": tfds.features.Tensor(shape=(None,), dtype=np.uint8),
            "label": tfds.features.ClassLabel(names=list(self._packages)),
            "path": tfds.features.Text(),
        }),
        supervised_keys=("text", "label"),
    )

  def _split_generators(self, dl_manager):
    del dl_manager  # Nothing to download.
    by_split = {split: [] for split in SPLITS}
    for path in self._paths:
      by_split[builtin.split_of(path)].append(path)
    return {split: self._generate_examples(paths) for split, paths in by_split.items()}

  def _generate_examples(self, relative_paths):
    for path in relative_paths:
      label = self._packages.index(path.split(os.sep, 1)[0])
      with open(os.path.join(self._source_root, path), "rb") as f:
        data_bytes = np.frombuffer(f.read(), dtype=np.uint8)
      for start in snippet_starts(len(data_bytes), self._snippet_bytes, self._max_snippets):
        text = data_bytes[start:start + self._snippet_bytes]
        yield f"{path}@{start}", {"text": text, "label": label, "path": path}
