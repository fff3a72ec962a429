"""The persistent compilation cache of train.py / eval.py (`training.compilation_cache`) and
its benchmark: a second run loads the training step it compiled before."""

import json

import jax

from benchmarks import compilation_cache as cache_benchmark
from sparse_jax.training import compilation_cache


def test_the_flag_sets_jaxs_cache_and_an_empty_one_turns_it_off(tmp_path, monkeypatch):
  saved = {name: getattr(jax.config, name) for name in ("jax_enable_compilation_cache",
                                                         "jax_compilation_cache_dir")}
  try:
    compilation_cache.use_compilation_cache(str(tmp_path / "c"))
    assert jax.config.jax_enable_compilation_cache
    assert jax.config.jax_compilation_cache_dir == str(tmp_path / "c")
    compilation_cache.use_compilation_cache("")
    assert not jax.config.jax_enable_compilation_cache
  finally:
    for name, value in saved.items():
      jax.config.update(name, value)
  monkeypatch.delenv("JAX_COMPILATION_CACHE_DIR")
  assert compilation_cache.default_directory() == compilation_cache.DEFAULT_DIRECTORY
  monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", "/somewhere")
  assert compilation_cache.default_directory() == "/somewhere"


def test_a_second_run_compiles_from_the_cache(tmp_path):
  """Two train.py runs of a small model against one cache: the first writes its programs
  (the tests keep every program: conftest), the second finds them all and writes none."""
  path = tmp_path / "report.json"
  report = cache_benchmark.main(["--json", str(path), "--", "--config.model.n_layers=2",
                                 "--config.model.d_model=32", "--config.data.batch_size=2",
                                 "--config.data.seq_len=16", "--config.model.mem_len=16",
                                 "--config.mesh.data=1"])
  entries = report["cache_entries"]
  assert entries["after_cold"] > 0 and entries["after_warm"] == entries["after_cold"]
  assert report["warm_compile_s"] > 0
  assert json.loads(path.read_text())["cold_compile_s"] == report["cold_compile_s"]
