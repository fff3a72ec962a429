"""Wheels for a GPU node without internet: what sparse_jax needs there that the node lacks.

    python -m benchmarks.offline_bundle --python 3.12 --out wheels/
    bash benchmarks/gpu_offline.sh wheels/ gpu_out/         # then, on the node

Run on a machine that reaches a package index. Starting from the project's dependencies
(`pyproject.toml`) and the GPU suite's (`benchmarks/requirements-gpu.txt`), it downloads one
binary wheel per package for the node's Python (CPython, manylinux x86_64), reads each wheel's
`Requires-Dist` with its environment markers evaluated for that Python, and follows them. A
package the node already has is skipped: those `--have` names, and what they depend on as
installed here (pip put those on the node with them). Version ranges of every requirer of a
package are intersected, and the newest wheel inside them is kept. pip's own resolver is not
used because it would also resolve the `--have` packages (JAX for Python 3.12, say), which is
neither needed nor always possible from the same index.

A package published only as a source archive (`promise`, which tensorflow-datasets needs) is
built into a wheel here with `pip wheel` (with this machine's setuptools); it must come out
pure Python (`py3-none-any`).

The bundle is checked before the command succeeds: every file a wheel, one version per
package, total size under `--max_mib` (64 MiB: what travels to a lent GPU machine). The exact
versions and sha256 of every wheel go to `requirements.lock` in the bundle, which
`pip install --no-index --no-deps --require-hashes -r` can check on the node.
"""

import argparse
import dataclasses
import email.parser
import hashlib
import importlib.metadata
import pathlib
import shutil
import subprocess
import sys
import tempfile
import tomllib
import zipfile

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name, parse_wheel_filename
from packaging.version import Version

REPO = pathlib.Path(__file__).resolve().parents[1]
# What a GPU image with JAX has (the machines we are lent have these and much more).
DEFAULT_HAVE = ("jax", "jaxlib", "flax", "optax", "orbax-checkpoint", "numpy", "pytest",
                "pytest-xdist")
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64",
             "manylinux2014_x86_64", "manylinux1_x86_64")
# Left out of the bundle (which installs with --no-deps), each with the reason; `--keep`
# puts one back. Two are declared dependencies that nothing sparse_jax runs imports; tokamax is
# an optional peer of the GPU suite (its cells and tests then read "not installed").
LEFT_OUT = {
    "pyarrow": "tensorflow-datasets imports it only in its Parquet and Hugging Face builders "
               "(40 MB, over the bundle's budget on its own)",
    "huggingface-hub": "tokenizers imports it only to download from the Hub; sparse_jax reads "
                       "local tokenizer files",
    "tokamax": "optional; since 0.0.13 it imports the xprof profiler (32 MB, with duckdb and "
               "Google Cloud clients another 40), and 0.0.12 fails on JAX 0.11",
}
LOCK_FILE = "requirements.lock"


class BundleError(RuntimeError):
  """The bundle cannot be built or fails its checks; the message says which and why."""


@dataclasses.dataclass
class Wanted:
  """A package to bundle: the intersection of its requirers' ranges, and who asked."""
  specifier: SpecifierSet
  extras: set[str]
  requirers: list[str]


def target_environment(python: str) -> dict[str, str]:
  """Marker values of CPython `python` ("3.12") on Linux x86_64."""
  env = default_environment()
  env.update(python_version=python, python_full_version=f"{python}.0",
             implementation_name="cpython", platform_python_implementation="CPython",
             sys_platform="linux", platform_system="Linux", platform_machine="x86_64",
             os_name="posix", implementation_version=f"{python}.0")
  return env


def applies(req: Requirement, env: dict[str, str], extras: set[str]) -> bool:
  """Whether `req` holds for the target: its marker true with no extra or a wanted one."""
  if req.marker is None:
    return True
  return any(req.marker.evaluate({**env, "extra": extra}) for extra in {"", *extras})


def root_requirements() -> list[Requirement]:
  """The project's dependencies and the GPU suite's (`benchmarks/requirements-gpu.txt`)."""
  project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
  lines = (REPO / "benchmarks" / "requirements-gpu.txt").read_text().splitlines()
  suite = [line.split("#")[0].strip() for line in lines]
  return [Requirement(text) for text in [*project, *suite] if text]


def have_closure(names: list[str], env: dict[str, str]) -> set[str]:
  """`names` and, as installed here, what they depend on (recursively) for the target."""
  seen, todo = set(), [canonicalize_name(n) for n in names]
  while todo:
    name = todo.pop()
    if name in seen:
      continue
    seen.add(name)
    try:
      requires = importlib.metadata.requires(name) or []
    except importlib.metadata.PackageNotFoundError:
      continue
    for text in requires:
      req = Requirement(text)
      if applies(req, env, extras=set()):
        todo.append(canonicalize_name(req.name))
  return seen


def _pip(*args: str) -> subprocess.CompletedProcess:
  return subprocess.run([sys.executable, "-m", "pip", *args], capture_output=True, text=True,
                        check=False)


def download(name: str, spec: SpecifierSet, python: str, out: pathlib.Path,
             index_args: list[str]) -> pathlib.Path:
  """Downloads the newest wheel of `name` in `spec` for the target into `out`; builds one
  from the source archive when the package publishes no wheel."""
  requirement = f"{name}{spec}"
  with tempfile.TemporaryDirectory() as tmp:
    platform_args = [arg for p in PLATFORMS for arg in ("--platform", p)]
    got = _pip("download", "--no-deps", "--only-binary=:all:", "--python-version", python,
               "--implementation", "cp", *platform_args, "-d", tmp, *index_args, requirement)
    if got.returncode != 0:
      got = _pip("wheel", "--no-deps", "--no-build-isolation", "-w", tmp, *index_args,
                 requirement)
      wheels = list(pathlib.Path(tmp).glob("*.whl"))
      if got.returncode != 0 or not wheels:
        raise BundleError(f"no wheel of {requirement} for CPython {python} manylinux x86_64, "
                          f"and building one failed:\n{got.stderr[-2000:]}")
      if not all(tag.abi == "none" and tag.platform == "any"
                 for tag in parse_wheel_filename(wheels[0].name)[3]):
        raise BundleError(f"{requirement} has no wheel for CPython {python}, and the one built "
                          f"here ({wheels[0].name}) is for this machine only")
    (wheel,) = pathlib.Path(tmp).glob("*.whl")
    return pathlib.Path(shutil.move(wheel, out / wheel.name))


def wheel_requirements(wheel: pathlib.Path) -> list[Requirement]:
  """The `Requires-Dist` entries of a wheel's METADATA."""
  with zipfile.ZipFile(wheel) as archive:
    (metadata,) = [n for n in archive.namelist()
                   if n.count("/") == 1 and n.endswith(".dist-info/METADATA")]
    message = email.parser.Parser().parsestr(archive.read(metadata).decode())
  return [Requirement(text) for text in message.get_all("Requires-Dist") or []]


def build(python: str, out: pathlib.Path, skip: set[str], index_args: list[str],
          roots: list[Requirement], log=print) -> dict[str, pathlib.Path]:
  """Downloads into `out` the wheels of `roots` and their dependencies for CPython `python`,
  except the (canonical) names in `skip`: {package: wheel}."""
  env = target_environment(python)
  wanted: dict[str, Wanted] = {}
  wheels: dict[str, pathlib.Path] = {}
  todo = [(req, "sparse_jax") for req in roots]
  while todo:
    req, requirer = todo.pop(0)
    name = canonicalize_name(req.name)
    if name in skip:
      continue
    entry = wanted.setdefault(name, Wanted(SpecifierSet(), set(), []))
    entry.specifier &= req.specifier
    entry.requirers.append(requirer)
    new_extras = set(req.extras) - entry.extras
    entry.extras |= new_extras
    current = wheels.get(name)
    if current is not None:
      version = parse_wheel_filename(current.name)[1]
      if entry.specifier.contains(version, prereleases=True) and not new_extras:
        continue
      if not entry.specifier.contains(version, prereleases=True):
        current.unlink()
        del wheels[name]
    if name not in wheels:
      wheels[name] = download(name, entry.specifier, python, out, index_args)
      log(f"  {wheels[name].name}  (for {', '.join(sorted(set(entry.requirers)))})")
    for dep in wheel_requirements(wheels[name]):
      if applies(dep, env, entry.extras):
        todo.append((dep, name))
  return wheels


def check(out: pathlib.Path, max_bytes: int) -> int:
  """The bundle's checks: only wheels, one version per package, total under `max_bytes`.
  Returns the total size in bytes."""
  files = sorted(p for p in out.iterdir() if p.name != LOCK_FILE)
  not_wheels = [p.name for p in files if p.suffix != ".whl"]
  if not_wheels:
    raise BundleError(f"not wheels (sdists cannot install offline with --no-deps): {not_wheels}")
  by_name: dict[str, list[str]] = {}
  for p in files:
    by_name.setdefault(parse_wheel_filename(p.name)[0], []).append(p.name)
  twice = {name: names for name, names in by_name.items() if len(names) > 1}
  if twice:
    raise BundleError(f"more than one version of a package (pip would refuse): {twice}")
  total = sum(p.stat().st_size for p in files)
  if total > max_bytes:
    raise BundleError(f"bundle is {total / 2**20:.1f} MiB, over the {max_bytes / 2**20:.0f} "
                      f"MiB limit; add what the node has to --have")
  return total


def write_lock(out: pathlib.Path) -> pathlib.Path:
  """`name==version --hash=sha256:...` per wheel, for `pip install --require-hashes`."""
  lines = []
  for p in sorted(out.glob("*.whl")):
    name, version = parse_wheel_filename(p.name)[:2]
    digest = hashlib.sha256(p.read_bytes()).hexdigest()
    lines.append(f"{name}=={version} --hash=sha256:{digest}")
  lock = out / LOCK_FILE
  lock.write_text("\n".join(lines) + "\n")
  return lock


def _parse(argv):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--python", required=True, help="the node's Python, e.g. 3.12")
  parser.add_argument("--out", required=True, type=pathlib.Path,
                      help="folder for the wheels (emptied of old wheels first)")
  parser.add_argument("--have", default=",".join(DEFAULT_HAVE),
                      help="comma-separated packages the node has (default: %(default)s)")
  parser.add_argument("--keep", default="", help=f"comma-separated names of {sorted(LEFT_OUT)} "
                      "to bundle anyway")
  parser.add_argument("--max_mib", type=float, default=64.0)
  parser.add_argument("--find_links", default=None,
                      help="a folder of wheels to use instead of the configured index (tests)")
  return parser.parse_args(argv)


def main(argv=None) -> int:
  args = _parse(argv)
  if Version(args.python).release[:1] != (3,) or len(Version(args.python).release) != 2:
    raise SystemExit(f"--python must be a CPython version like 3.12, got {args.python!r}")
  env = target_environment(args.python)
  have = have_closure([n for n in args.have.split(",") if n], env)
  keep = {canonicalize_name(name) for name in args.keep.split(",") if name}
  left_out = {name: why for name, why in LEFT_OUT.items() if name not in keep}
  index_args = ["--no-index", "--find-links", args.find_links] if args.find_links else []
  args.out.mkdir(parents=True, exist_ok=True)
  for old in [*args.out.glob("*.whl"), args.out / LOCK_FILE]:
    old.unlink(missing_ok=True)
  print(f"bundling for CPython {args.python} manylinux x86_64 into {args.out}; skipping "
        f"{len(have)} packages the node has ({', '.join(sorted(have))}) and "
        f"{', '.join(f'{k} ({v})' for k, v in left_out.items()) or 'nothing else'}")
  try:
    wheels = build(args.python, args.out, have | set(left_out), index_args, root_requirements())
    total = check(args.out, int(args.max_mib * 2**20))
  except BundleError as error:
    print(f"error: {error}", file=sys.stderr)
    return 1
  lock = write_lock(args.out)
  print(f"{len(wheels)} wheels, {total / 2**20:.1f} MiB (limit {args.max_mib:.0f}); "
        f"versions and hashes in {lock}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
