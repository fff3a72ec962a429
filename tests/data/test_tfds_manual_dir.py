"""Our TFDS builders follow TFDS's manual_dir convention: a source placed in the directory of
`tfds.download.DownloadConfig(manual_dir=...)` or of `tfds build --manual_dir` is found, with
our config field `data.manual_dir` taking precedence when it is set."""

import os
import subprocess
import sys
import zipfile

import numpy as np
import pytest
import tensorflow_datasets as tfds
from test_enwik8 import SCALED_SPLIT, wiki_like_bytes, write_zip

from sparse_jax.data import enwik8, sources

SPLITS = tuple(zip(("train", "validation", "test"), SCALED_SPLIT))


def _prepare(builder, manual_dir):
  builder.download_and_prepare(download_config=tfds.download.DownloadConfig(
      manual_dir=str(manual_dir), try_download_gcs=False))


def _split_bytes(builder, split) -> bytes:
  source = builder.as_data_source(split=split)
  return b"".join(bytes(np.asarray(source[i]["bytes"], np.uint8)) for i in range(len(source)))


def test_download_config_manual_dir_is_searched(tmp_path):
  content = wiki_like_bytes(sum(SCALED_SPLIT), seed=3)
  write_zip(tmp_path / "manual.zip", content)
  os.makedirs(tmp_path / "manual")
  os.rename(tmp_path / "manual.zip", tmp_path / "manual" / enwik8.ARCHIVE)
  builder = enwik8.Enwik8(split_bytes=SPLITS, download=False, data_dir=str(tmp_path / "tfds"),
                          file_format="array_record")
  _prepare(builder, tmp_path / "manual")
  assert _split_bytes(builder, "validation") == content[SCALED_SPLIT[0]:sum(SCALED_SPLIT[:2])]


def test_the_builders_own_manual_dir_wins(tmp_path):
  ours, theirs = tmp_path / "ours", tmp_path / "theirs"
  os.makedirs(ours), os.makedirs(theirs)
  write_zip(ours / enwik8.ARCHIVE, wiki_like_bytes(sum(SCALED_SPLIT), seed=1))
  write_zip(theirs / enwik8.ARCHIVE, wiki_like_bytes(sum(SCALED_SPLIT), seed=2))
  builder = enwik8.Enwik8(manual_dir=str(ours), split_bytes=SPLITS, download=False,
                          data_dir=str(tmp_path / "tfds"), file_format="array_record")
  _prepare(builder, theirs)
  expected = wiki_like_bytes(sum(SCALED_SPLIT), seed=1)[:SCALED_SPLIT[0]]
  assert _split_bytes(builder, "train") == expected


def test_a_missing_source_names_the_tfds_manual_dir(tmp_path):
  builder = enwik8.Enwik8(split_bytes=SPLITS, download=False, data_dir=str(tmp_path / "tfds"),
                          file_format="array_record")
  empty = tmp_path / "empty_manual"
  with pytest.raises(sources.MissingSourceError,
                     match=f"not found in manual_dir '{empty}'.*tfds build --manual_dir"):
    _prepare(builder, empty)


def test_tfds_build_with_manual_dir(tmp_path):
  """`tfds build --imports sparse_jax.data.enwik8 enwik8 --manual_dir M --data_dir D
  --file_format array_record`, run as TFDS's `build` command runs it after parsing (the
  `tfds` entry point itself imports TensorFlow, which this project does not need). The CLI
  builds the standard split, so the archive holds the full 10^8 bytes (repetitive:
  stored uncompressed, fast to write and read)."""
  manual = tmp_path / "manual"
  os.makedirs(manual)
  block = wiki_like_bytes(100_000, seed=4)
  with zipfile.ZipFile(manual / enwik8.ARCHIVE, "w", compression=zipfile.ZIP_STORED) as z:
    z.writestr(enwik8.MEMBER, block * 1000)
  args = ["--imports", "sparse_jax.data.enwik8", "enwik8", "--manual_dir", str(manual),
          "--data_dir", str(tmp_path / "tfds"), "--file_format", "array_record"]
  code = ("import sys, simple_parsing; from tensorflow_datasets.scripts.cli import build; "
          "simple_parsing.parse(build.Args, args=sys.argv[1:]).execute()")
  subprocess.run([sys.executable, "-c", code, *args], check=True, capture_output=True,
                 env=dict(os.environ, JAX_PLATFORMS="cpu"))
  builder = enwik8.Enwik8(data_dir=str(tmp_path / "tfds"), file_format="array_record")
  source = builder.as_data_source(split="test")
  first = bytes(np.asarray(source[0]["bytes"], np.uint8))
  start = 95_000_000 % len(block)
  assert first == (block * (2 + len(first) // len(block)))[start:start + len(first)]
