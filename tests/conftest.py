"""Shared test setup: fast compilation, and a tiny real slice of the `builtin` corpus."""

import ctypes
import gc
import os
import shutil
import tempfile
from unittest import mock

import jax
import pytest
import tensorflow_datasets as tfds

import glue_testing
from lm_testing import tiny_lm_config

# The tests run on the CPU, and so do the processes they start: with the compile extra
# installed, the CUDA plugin and libtpu are compilers for tests/aot only, never backends
# (on a GPU machine, JAX_PLATFORMS=cuda,cpu runs the GPU-only tests).
os.environ.setdefault("JAX_PLATFORMS", "cpu")
jax.config.update("jax_platforms", os.environ["JAX_PLATFORMS"])
# Compile time dominates small JAX tests; these tests check semantics, not XLA's optimiser.
# Through the environment, the processes the tests start (train.py, the notebook's kernel)
# compile the same way.
os.environ.setdefault("JAX_DISABLE_MOST_OPTIMIZATIONS", "true")
jax.config.update("jax_disable_most_optimizations", True)
# And the tests compile the same tiny models many times over: one persistent compilation cache
# per session, shared by the xdist workers and (through the environment) by the train.py /
# eval.py subprocesses they start. A fresh directory per session: every run compiles cold once.
_SESSION = os.environ.get("PYTEST_XDIST_TESTRUNUID", str(os.getpid()))
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR",
                      os.path.join(tempfile.gettempdir(), f"sparse_jax_tests_{_SESSION}"))
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")
jax.config.update("jax_compilation_cache_dir", os.environ["JAX_COMPILATION_CACHE_DIR"])
jax.config.update("jax_persistent_cache_min_compile_time_secs",
                  float(os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"]))
jax.config.update("jax_persistent_cache_min_entry_size_bytes",
                  int(os.environ["JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES"]))
# Eight simulated CPU devices for the mesh tests; everything else runs on the first one.
jax.config.update("jax_num_cpu_devices", 8)

try:
  _LIBC = ctypes.CDLL("libc.so.6")
except OSError:  # Not glibc (macOS): nothing to trim.
  _LIBC = None

# The end-to-end tests, marked `slow`: they run as their own step (`python -m pytest -n 2 -m slow
# tests`; README, .ci/run) so that the rest (`-m "not slow"`) stays near 11 minutes on 2 cores
# (CI's limit for it: 15). Each takes a minute or more (train.py / eval.py processes, kill loops,
# meshes of processes, tasks trained to completion, the benchmarks' smoke runs), or is a file
# whose compiles take a minute or more together (the multi-device layers and decoding, the
# scanned layers, the command-line recipes); together about half of the suite's time.
SLOW_TESTS = (
    "tests/test_cli.py",
    "tests/training/test_kill_resume.py",
    "tests/training/test_checkpoint_faults.py",
    "tests/training/test_parallel_training.py",
    "tests/training/test_tensor_parallel.py",
    "tests/training/test_finetune_engine.py",
    "tests/training/test_attention_kinds_resume.py",
    "tests/training/test_rng_impl.py::test_rbg_run_resumes_exactly_and_its_checkpoint_evaluates",
    "tests/training/test_arxiv_task.py",
    "tests/training/test_finetune_offline.py",
    "tests/training/test_seq2seq_task.py::test_train_resume_and_eval_on_the_long_test_split",
    "tests/training/test_seq2seq_task.py::test_a_checkpoint_saved_before_the_trax_options",
    "tests/training/test_seq2seq_task.py::test_train_to_completion_refuses_to_report",
    "tests/training/test_bfloat16_training.py",
    "tests/data/test_enwik8.py::test_e8_config_trains_and_evaluates_on_a_prepared_copy",
    "tests/data/test_wikitext103.py::test_wt_s_config_trains_and_reports_token_and_word",
    "tests/figures/test_attention_routing.py",
    "tests/test_quickstart_notebook.py",
    "tests/test_gpu_suite_smoke.py",
    "tests/test_offline_bundle.py",
    "tests/test_scaling_benchmark_smoke.py",
    "tests/test_decode_benchmark_smoke.py",
    "tests/test_length_generalization_smoke.py",
    "tests/test_spartan_stdlib_seeds_smoke.py",
    "tests/test_switchhead_small_smoke.py",
    "tests/test_tensor_parallel_collectives_smoke.py",
    "tests/test_installed_package.py",
    "tests/test_api_reference.py::test_sphinx_builds_the_reference_and_its_examples_pass",
    "tests/layers/test_expert_parallel.py",
    "tests/layers/test_sequence_parallel.py",
    "tests/models/test_tensor_decoding.py",
    "tests/models/test_layer_scan.py",
    "tests/models/test_moeut_authors.py",
    "tests/figures/test_model_figures.py",
    "tests/test_cli_recipes.py",
    "tests/test_step_dispatch_smoke.py",
    "tests/test_compilation_cache.py",
)
# Run first within their step: with `-n 2` the workers take tests in collection order, so a
# long test collected last would run alone at the end while the other worker idles.
_LONG_TESTS_FIRST = SLOW_TESTS + ("tests/training/",)


def pytest_addoption(parser):
  parser.addoption(
      "--fault-kills", type=int, default=1, metavar="N",
      help="random SIGKILLs per run in tests/training/test_kill_resume.py, after its chosen "
           "ones (default 1, to keep the suite quick; 30 for a long run)")


@pytest.hookimpl(tryfirst=True)  # Before `-m` deselects by marker.
def pytest_collection_modifyitems(items):
  for item in items:
    if item.nodeid.startswith(SLOW_TESTS):
      item.add_marker(pytest.mark.slow)
  items.sort(key=lambda item: not item.nodeid.startswith(_LONG_TESTS_FIRST))


@pytest.fixture(autouse=True, scope="module")
def _free_compiled_programs():
  """After each test module, drops JAX's in-memory caches of traced and compiled programs and
  hands the freed heap back to the system. Each xdist worker runs ~1000 tests: kept, those
  caches grew each worker to 8 GiB by the end of the quick step, and a CI worker crashed
  mid-test (stop 79; memory the likely cause, no signal printed). Later modules reload what
  they share from the persistent cache above; the step takes no longer."""
  yield
  jax.clear_caches()
  gc.collect()
  if _LIBC is not None:
    _LIBC.malloc_trim(0)  # glibc keeps freed pages mapped otherwise.


_FILES_PER_SPLIT = {"train": 12, "validation": 3, "test": 3}
_MAX_FILE_BYTES = 20_000


@pytest.fixture
def full_float32_matmuls():
  """Full float32 products for a test comparing float32 with float32 tolerances. On a GPU,
  XLA multiplies float32 matrices in TF32 by default (a 10-bit mantissa: relative errors near
  1e-4 to 1e-3, which failed five MoE-layer tests and every fused-XL-attention comparison on
  an H200); on the CPU this changes nothing. Every test under tests/layers uses it, and the
  fused XL attention's tests, whose kernels multiply float32 tiles in IEEE float32."""
  with jax.default_matmul_precision("highest"):
    yield


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
  """`tiny_lm_config` with its data in this test's directory."""
  return tiny_lm_config(stdlib_slice, str(tmp_path / "tfds"))


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
