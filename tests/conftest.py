"""Shared test setup: fast compilation, and a tiny real slice of the `builtin` corpus."""

import os
import shutil
from unittest import mock

import jax
import pytest
import tensorflow_datasets as tfds

import glue_testing

# Compile time dominates small JAX tests; these tests check semantics, not XLA's optimiser.
jax.config.update("jax_disable_most_optimizations", True)
# Eight simulated CPU devices for the mesh tests; everything else runs on the first one.
jax.config.update("jax_num_cpu_devices", 8)

_FILES_PER_SPLIT = {"train": 12, "validation": 3, "test": 3}
_MAX_FILE_BYTES = 20_000


@pytest.fixture(scope="session")
def stdlib_slice(tmp_path_factory) -> str:
  """A directory holding a few real standard-library files, with every split non-empty."""
  from sparse_jax.data import builtin

  root = builtin.stdlib_root()
  wanted = dict(_FILES_PER_SPLIT)
  target = tmp_path_factory.mktemp("stdlib_slice")
  for path in builtin.list_sources(root):
    split = builtin.split_of(path)
    size = os.path.getsize(os.path.join(root, path))
    if wanted[split] and 2_000 < size < _MAX_FILE_BYTES:
      wanted[split] -= 1
      os.makedirs(os.path.dirname(target / path), exist_ok=True)
      shutil.copy(os.path.join(root, path), target / path)
  assert not any(wanted.values()), f"stdlib too small for the test slice: {wanted}"
  return str(target)


@pytest.fixture
def tiny_config(stdlib_slice, tmp_path):
  """The default config (a sigma-MoE LM) shrunk to a model and data that train in seconds."""
  from configs import default

  config = default.get_config()
  config.data.source_root = stdlib_slice
  config.data.data_dir = str(tmp_path / "tfds")
  config.data.batch_size = 4
  config.data.seq_len = 16
  config.model.update(d_model=32, n_layers=2, n_heads=2, mem_len=16, dropout=0.1)
  config.model.ff.update(n_experts=4, expert_size=16, k=2, expert_dropout=0.1)
  config.train.update(steps=6, warmup_steps=2, log_every=1, eval_every=100, ckpt_every=3)
  config.eval.update(batch_size=2, mem_len=32, max_batches=4)
  config.mesh.data = 1  # one device; tests/training/test_parallel_training.py uses meshes.
  return config


@pytest.fixture(scope="session")
def glue_downloads(tmp_path_factory):
  """A local folder per GLUE URL, holding the extracted archive in GLUE's layout."""
  root = tmp_path_factory.mktemp("glue_downloads")
  folders = {}
  for i, (url, (folder, files)) in enumerate(glue_testing.GLUE_ARCHIVES.items()):
    extracted = root / f"archive{i}"
    os.makedirs(extracted / folder)
    for name, text in files.items():
      (extracted / folder / name).write_text(text, encoding="utf-8")
    folders[url] = str(extracted)
  return folders


@pytest.fixture(scope="module")
def offline_glue(glue_downloads):
  """Patches TFDS's download manager (for the using module only) to serve `glue_downloads`;
  records the URLs asked for."""
  requested = []

  def download_and_extract(self, url):
    del self
    requested.append(url)
    return glue_downloads[url]

  with mock.patch.object(tfds.download.DownloadManager, "download_and_extract",
                         autospec=True, side_effect=download_and_extract):
    yield requested
