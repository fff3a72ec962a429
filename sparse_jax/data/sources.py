"""Finding a dataset's source file: TFDS `manual_dir` first, then its download URL.

A source that cannot be found raises `MissingSourceError` saying which file is expected,
which manual_dir was searched and where the file can be downloaded, so a user without network
on the training machine knows exactly what to copy where.
"""

import os

import tensorflow_datasets as tfds

# The record format our builders write unless told otherwise (`file_format=`, or `tfds build
# --file_format`): random access without TensorFlow. TFDS's default, TFRecord, needs TensorFlow
# to write.
FILE_FORMAT = "array_record"


class MissingSourceError(FileNotFoundError):
  """A dataset's source file is neither in manual_dir nor downloadable."""


class BadSourceError(ValueError):
  """A dataset's source file exists but is not what the builder expects (size, format)."""


def resolve_manual_dir(manual_dir: str | None,
                       dl_manager: tfds.download.DownloadManager) -> str | None:
  """`manual_dir` when given (the builder's argument: config field `data.manual_dir`), else
  TFDS's: `DownloadConfig(manual_dir=...)` or `tfds build --manual_dir`, by default
  `<download_dir>/manual` (the builder must set `MANUAL_DOWNLOAD_INSTRUCTIONS`)."""
  if manual_dir:
    return manual_dir
  try:
    return os.fspath(dl_manager.manual_dir)
  except AssertionError:  # TFDS refuses a missing or empty manual_dir; name it in our error.
    missing = getattr(dl_manager, "_manual_dir", None)
    return os.fspath(missing) if missing else None


def locate(dataset: str, filename: str, *, manual_dir: str | None, url: str,
           download: bool, dl_manager: tfds.download.DownloadManager) -> str:
  """The path of `filename` in the manual_dir (`resolve_manual_dir`), else of its download
  from `url`.

  Downloading happens only when `download` is true; a failed or disabled download raises
  `MissingSourceError` naming the file, the manual_dir searched and the URL.
  """
  manual_dir = resolve_manual_dir(manual_dir, dl_manager)
  if manual_dir and os.path.isfile(os.path.join(manual_dir, filename)):
    return os.path.join(manual_dir, filename)
  where = (f"{dataset}: source file {filename!r} not found in manual_dir {manual_dir!r}. "
           f"Download it from {url} and put it there (config field data.manual_dir, or "
           f"TFDS's DownloadConfig(manual_dir=...) / `tfds build --manual_dir`)")
  if not download:
    raise MissingSourceError(where + "; downloading is off (data.download=False).")
  try:
    return os.fspath(dl_manager.download(url))
  except Exception as e:  # Any network or HTTP failure: say where to put the file instead.
    raise MissingSourceError(f"{where}; downloading it failed: {e}") from e
