"""The offline GPU bundle: the builder against a fake index (no network), its checks, and the
whole flow for this Python: bundle from the real index, `gpu_offline.sh --smoke` installing it
with no index into a fresh folder and running the suite from there."""

import hashlib
import json
import os
import pathlib
import subprocess
import sys
import zipfile

import jax
import pytest
from packaging.requirements import Requirement

from benchmarks import offline_bundle

REPO = pathlib.Path(__file__).resolve().parents[1]
THIS_PYTHON = f"{sys.version_info.major}.{sys.version_info.minor}"


def _wheel(index: pathlib.Path, name: str, version: str, requires: tuple[str, ...] = ()):
  """A pure-Python wheel of `name` whose METADATA declares `requires`."""
  dist_info = f"{name}-{version}.dist-info"
  metadata = "\n".join(["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}",
                        *[f"Requires-Dist: {r}" for r in requires]]) + "\n"
  with zipfile.ZipFile(index / f"{name}-{version}-py3-none-any.whl", "w") as archive:
    archive.writestr(f"{name}/__init__.py", "")
    archive.writestr(f"{dist_info}/METADATA", metadata)
    archive.writestr(f"{dist_info}/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\n"
                                           "Tag: py3-none-any\n")
    archive.writestr(f"{dist_info}/RECORD", "")


@pytest.fixture(scope="module")
def fake_index(tmp_path_factory) -> pathlib.Path:
  index = tmp_path_factory.mktemp("index")
  _wheel(index, "alpha", "1.0", ("beta>=2", "gamma; python_version < '3.12'", "delta[fast]",
                                 "node_has", "omega; extra == 'docs'"))
  _wheel(index, "beta", "2.0")
  _wheel(index, "beta", "3.0")
  _wheel(index, "capper", "1.0", ("beta<3",))
  _wheel(index, "delta", "1.0", ("zeta; extra == 'fast'",))
  for name in ("gamma", "zeta", "node_has", "omega"):
    _wheel(index, name, "1.0")
  return index


def _build(fake_index, out, python, roots):
  out.mkdir()
  return offline_bundle.build(python, out, {"node-has"},
                              ["--no-index", "--find-links", str(fake_index)],
                              [Requirement(r) for r in roots], log=lambda *_: None)


@pytest.mark.parametrize("python, marker_dependency", [("3.12", set()), ("3.11", {"gamma"})])
def test_builder_follows_markers_extras_and_intersected_ranges(fake_index, tmp_path, python,
                                                               marker_dependency):
  wheels = _build(fake_index, tmp_path / "out", python, ["alpha", "capper"])
  # beta: alpha asks >=2 (3.0 comes first), capper <3, so 3.0 is replaced by 2.0; zeta only
  # through delta[fast]; omega only for an extra nobody asked for; node_has is skipped.
  want = {"alpha": "1.0", "beta": "2.0", "capper": "1.0", "delta": "1.0", "zeta": "1.0",
          **{name: "1.0" for name in marker_dependency}}
  got = {name: path.name.split("-")[1] for name, path in wheels.items()}
  assert got == want
  assert sorted(p.name for p in (tmp_path / "out").iterdir()) == sorted(
      p.name for p in wheels.values())


def test_builder_fails_on_ranges_nothing_satisfies(fake_index, tmp_path):
  with pytest.raises(offline_bundle.BundleError, match="beta"):
    _build(fake_index, tmp_path / "out", "3.12", ["beta>=3", "capper"])


def test_lock_pins_every_wheel_with_its_hash(fake_index, tmp_path):
  wheels = _build(fake_index, tmp_path / "out", "3.12", ["capper"])
  lock = offline_bundle.write_lock(tmp_path / "out").read_text().splitlines()
  digest = hashlib.sha256(wheels["beta"].read_bytes()).hexdigest()
  assert lock == ["beta==2.0 --hash=sha256:" + digest,
                  "capper==1.0 --hash=sha256:"
                  + hashlib.sha256(wheels["capper"].read_bytes()).hexdigest()]


@pytest.mark.parametrize("extra_file, message", [
    ("beta-2.0.tar.gz", "not wheels"),
    ("beta-3.0-py3-none-any.whl", "more than one version"),
])
def test_check_refuses_sdists_and_second_versions(fake_index, tmp_path, extra_file, message):
  _build(fake_index, tmp_path / "out", "3.12", ["capper"])
  (tmp_path / "out" / extra_file).write_bytes(b"x")
  with pytest.raises(offline_bundle.BundleError, match=message):
    offline_bundle.check(tmp_path / "out", max_bytes=2**20)


def test_check_refuses_a_bundle_over_the_limit(fake_index, tmp_path):
  _build(fake_index, tmp_path / "out", "3.12", ["capper"])
  total = offline_bundle.check(tmp_path / "out", max_bytes=2**20)
  assert total == sum(p.stat().st_size for p in (tmp_path / "out").iterdir())
  with pytest.raises(offline_bundle.BundleError, match="over the 0 MiB limit"):
    offline_bundle.check(tmp_path / "out", max_bytes=total - 1)


def _index_reachable(tmp_path) -> bool:
  probe = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps",
                          "--only-binary=:all:", "-d", str(tmp_path / "probe"), "toml"],
                         capture_output=True, check=False)
  return probe.returncode == 0


def _gpu_offline(*args, tmp_path):
  return subprocess.run(["bash", str(REPO / "benchmarks" / "gpu_offline.sh"), *args],
                        capture_output=True, text=True, check=False,
                        env={**os.environ, "TMPDIR": str(tmp_path), "PYTHON": sys.executable})


def test_bundle_installs_with_no_index_and_runs_the_smoke_suite(tmp_path):
  if not _index_reachable(tmp_path):
    pytest.skip("no package index reachable: the bundle is built from the real index")
  wheels, out = tmp_path / "wheels", tmp_path / "out"
  built = subprocess.run([sys.executable, "-m", "benchmarks.offline_bundle", "--python",
                          THIS_PYTHON, "--out", str(wheels)], cwd=REPO, capture_output=True,
                         text=True, check=False)
  assert built.returncode == 0, built.stderr[-3000:]
  assert (wheels / offline_bundle.LOCK_FILE).exists()
  if jax.default_backend() != "gpu":
    refused = _gpu_offline(str(wheels), str(tmp_path / "refused"), tmp_path=tmp_path)
    assert refused.returncode != 0
    assert "no GPU visible to JAX" in refused.stdout + refused.stderr
    assert not (tmp_path / "refused" / "gpu_suite.json").exists()
  # A wheel an older bundle left in the folder is not installed: only the lock is.
  _wheel(wheels, "stray", "1.0")
  # Arguments after OUT reach the suite: one training comparison, so the smoke run is short.
  ran = _gpu_offline("--smoke", str(wheels), str(out), "--training=sigma_moe",
                     tmp_path=tmp_path)
  assert ran.returncode == 0, (ran.stdout + ran.stderr)[-3000:]
  suite = json.loads((out / "gpu_suite.json").read_text())
  assert {r["comparison"] for r in suite["training"]["rows"]} == {"sigma_moe"}
  assert sorted(p.name for p in out.iterdir()) == [
      "decode.json", "environment.txt", "gpu_offline.log", "gpu_suite.json", "gpu_suite.md",
      "tune_blocks.json"]
  # The packages the bundle brings were imported from the fresh folder, not this machine's.
  assert not list(tmp_path.glob("sparse_jax_site.*/stray")), "a wheel outside the lock"
  environment = (out / "environment.txt").read_text()
  for name in ("grain", "tensorflow-datasets", "ml-collections"):
    line = next(l for l in environment.splitlines() if l.startswith(name + " "))
    assert f" from {tmp_path}/sparse_jax_site." in line, line
