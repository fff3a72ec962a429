"""Accelerators we can compile for without having them: their descriptions and devices.

A target is named as `NAME` or `NAME:SHAPE` (NAME a section of `targets.toml`):

- GPUs (`h100`, `h200`, `a100`): `h100` is one GPU, `h100:8` eight GPUs on one host, and
  `h100:2x4` two hosts of four. XLA's GPU compiler reads the device from a
  `GpuTargetConfigProto` built from the file's fields.
- TPUs (`v5e`, `v5p`, `v6e`): `v5e` is one chip; `v5e:2x2` (a libtpu topology name) a slice of
  four. libtpu knows each chip itself.

`target_devices(target)` gives the abstract devices (JAX's `topologies` API) that
`jax.jit(...).trace(...).lower(lowering_platforms=...).compile()` compiles for on this CPU
machine, once the compile extra (`pip install -e ".[compile]"`: the CUDA plugin with
`ptxas`, and libtpu) is installed. JAX must run on the CPU (`use_cpu_backend()`, before any
other JAX call), or the plugins would try to open devices that are not there.
"""

import dataclasses
import functools
import importlib.util
import math
import os
import re
import tomllib
from pathlib import Path

import jax

TARGETS_FILE = Path(__file__).with_name("targets.toml")
GPU_FIELDS = ("threads_per_block_limit", "threads_per_warp", "shared_memory_per_block",
              "shared_memory_per_core", "threads_per_core_limit", "core_count",
              "fpus_per_core", "memory_bandwidth", "l2_cache_size", "clock_rate_ghz",
              "device_memory_size", "shared_memory_per_block_optin",
              "registers_per_core_limit", "registers_per_block_limit")
# What pip installs for each platform's compiler (the `compile` extra installs both).
_EXTRA_MODULES = {"gpu": "jax_cuda12_plugin", "tpu": "libtpu"}
LOWERING_PLATFORMS = {"gpu": "cuda", "tpu": "tpu"}


class TargetError(ValueError):
  """A target name that is not known, or one whose compiler is not installed."""


@dataclasses.dataclass(frozen=True)
class Target:
  """One accelerator of `targets.toml` and how many of it (`shape`)."""

  name: str
  platform: str  # "gpu" or "tpu"
  description: str
  shape: str  # GPUs: "partitions x hosts x devices per host"; TPUs: a topology.
  spec: dict = dataclasses.field(compare=False, repr=False)  # Its section of targets.toml.

  @property
  def n_devices(self) -> int:
    return math.prod(int(n) for n in self.shape.split("x"))

  @property
  def memory_bytes(self) -> int:
    """Memory of one device (HBM)."""
    return self.spec["device_memory_size" if self.platform == "gpu" else "memory_per_chip"]

  @property
  def lowering_platform(self) -> str:
    return LOWERING_PLATFORMS[self.platform]

  @property
  def sm(self) -> str | None:
    """The `ptxas -arch` of a GPU target (sm_90a for Hopper, which XLA compiles for)."""
    if self.platform != "gpu":
      return None
    major, minor = self.spec["compute_capability"]
    return f"sm_{major}{minor}{'a' if major >= 9 else ''}"

  def __str__(self) -> str:
    return f"{self.name}:{self.shape}"


@functools.cache
def known_targets() -> dict[str, dict]:
  with open(TARGETS_FILE, "rb") as f:
    return tomllib.load(f)


def parse_target(text: str) -> Target:
  """The target named by `NAME[:SHAPE]` (module docstring); raises `TargetError` naming the
  known targets and the accepted shapes."""
  name, _, shape = text.strip().lower().partition(":")
  specs = known_targets()
  if name not in specs:
    raise TargetError(f"unknown target {text!r}; known: {', '.join(specs)} (optionally "
                      "with ':N' GPUs or ':AxB' hosts x GPUs, or a TPU topology like "
                      "'v5e:2x2').")
  spec = specs[name]
  if spec["platform"] == "gpu":
    shape = _gpu_shape(text, shape)
  else:
    shape = shape or spec["default_topology"]
    if not re.fullmatch(r"\d+(x\d+){1,2}", shape):
      raise TargetError(f"target {text!r}: a TPU topology is written like 2x2 or 2x2x1.")
  return Target(name, spec["platform"], spec["description"], shape, spec)


def _gpu_shape(text: str, shape: str) -> str:
  """`1x1xN` for `N` GPUs on one host, `1xHxN` for `HxN`."""
  if not shape:
    return "1x1x1"
  if re.fullmatch(r"\d+", shape):
    return f"1x1x{int(shape)}"
  if re.fullmatch(r"\d+x\d+", shape):
    return f"1x{shape}"
  raise TargetError(f"target {text!r}: write GPUs as NAME:N (one host) or NAME:HOSTSxN.")


def gpu_target_config(spec: dict) -> str:
  """The `GpuTargetConfigProto` text of a GPU section of `targets.toml`."""
  major, minor = spec["compute_capability"]
  fields = " ".join(f"{field}: {spec[field]}" for field in GPU_FIELDS)
  fields += "".join(f" block_dim_limit_{axis}: {limit}"
                    for axis, limit in zip("xyz", spec["block_dim_limit"]))
  return (f"gpu_device_info {{ {fields} cuda_compute_capability {{ major: {major} minor: "
          f"{minor} }} }} platform_name: \"CUDA\" dnn_version_info {{ major: 9 minor: 7 }} "
          f"device_description_str: \"{spec['description']}\"")


def use_cpu_backend() -> None:
  """Keeps JAX on the CPU: the CUDA plugin and libtpu are only compilers here. Also turns the
  persistent compilation cache off: executables compiled without their device cannot be
  loaded back from it."""
  jax.config.update("jax_platforms", "cpu")
  jax.config.update("jax_enable_compilation_cache", False)


def require_compiler(target: Target) -> None:
  """Raises `TargetError` saying what to install unless `target`'s compiler is installed."""
  module = _EXTRA_MODULES[target.platform]
  if importlib.util.find_spec(module) is None:
    raise TargetError(f"compiling for {target.name} needs {module}, which is not installed: "
                      "pip install -e \".[compile]\" (the CUDA plugin with ptxas, and libtpu, "
                      "matching the installed jax).")


@functools.cache
def target_devices(target: Target) -> tuple[jax.Device, ...]:
  """The abstract devices of `target` (raises `TargetError` if its compiler is missing)."""
  from jax.experimental import topologies  # Imports the platform plugins: only when asked.

  require_compiler(target)
  # libtpu holds a lock file against a second process using the TPUs; there are none here,
  # and parallel test workers or a benchmark beside a test each load it as a compiler.
  os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
  # Nor is this a TPU VM: libtpu would ask the cloud metadata server for its workers and
  # print an INVALID_ARGUMENT trace when that fails.
  os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")
  os.environ.setdefault("TPU_WORKER_HOSTNAMES", "localhost")
  if target.platform == "gpu":
    topology = topologies.get_topology_desc(
        platform="cuda", target_config=gpu_target_config(target.spec), topology=target.shape)
  elif target.n_devices == 1:  # libtpu's default host is 2x2 chips: ask for one chip.
    topology = topologies.get_topology_desc(f"{target.name}:{target.shape}", platform="tpu",
                                            chips_per_host_bounds=[1, 1, 1])
  else:
    topology = topologies.get_topology_desc(f"{target.name}:{target.shape}", platform="tpu")
  return tuple(topology.devices)


def one_device_mesh(target: Target) -> jax.sharding.Mesh:
  """A one-axis mesh (`x`) over the first of `target`'s abstract devices."""
  return jax.sharding.Mesh(target_devices(target)[:1], ("x",))
