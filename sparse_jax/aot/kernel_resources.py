"""What our GPU kernels use of an SM, read from a compile for a GPU we do not have.

Compiling with `dump_options(DIR)` makes XLA write, per program, each kernel's PTX and the
thunk sequence (every launch with its grid, threads per block and shared memory). `ptxas -v`
(from the `nvidia-cuda-nvcc` wheel the compile extra installs) turns a PTX file into the
registers per thread and the bytes spilled to local memory. From registers, threads and
shared memory follows the theoretical occupancy: how many of the SM's thread slots resident
blocks can fill (CUDA Occupancy Calculator's rule, allocation granularities included). The
PTX also tells how wide a Triton kernel's global loads are (`global_load_bytes`) and which
tensor-core instructions its matmuls became (`ptx_instructions`: Hopper's wgmma, or Ampere's
mma.sync, which Triton emits for tiles too small for a warpgroup).

Mosaic GPU kernels are compiled by the CUDA plugin itself, not by XLA's pipeline: their PTX
(ISA 9.0, beyond the CUDA 12 ptxas) is not in XLA's dumps. Under `mosaic_dump(DIR)` the plugin
writes, per kernel, its PTX, its own ptxas report and its MLIR passes (whose `gpu.launch`
gives the grid, threads and dynamic shared memory); `mosaic_kernel_resources` reads them, and
from the PTX the SM it targets and its wgmma and TMA instructions (`ptx_instructions`).
The plugin compiles a kernel once per process: a kernel compiled before is not dumped again.
"""

import contextlib
import dataclasses
import glob
import importlib.util
import math
import os
import re
import subprocess

from sparse_jax.aot import targets

_LAUNCH = re.compile(r"\] (?P<name>\S+) grid: \[(?P<grid>[\d, ]+)\] threads: "
                     r"\[(?P<threads>[\d, ]+)\]\s+shared_memory: (?P<smem>\d+) bytes")
_ENTRY = re.compile(r"Compiling entry function '(?P<name>[^']+)'")
_SPILLS = re.compile(r"(?P<stores>\d+) bytes spill stores, (?P<loads>\d+) bytes spill loads")
_REGISTERS = re.compile(r"Used (?P<registers>\d+) registers")
_MOSAIC_LAUNCH = re.compile(
    r"blocks\([^)]*\) in \(%\w+ = %c(?P<g0>\d+), %\w+ = %c(?P<g1>\d+), %\w+ = %c(?P<g2>\d+)\) "
    r"threads\([^)]*\) in \(%\w+ = %c(?P<t0>\d+), %\w+ = %c(?P<t1>\d+), %\w+ = %c(?P<t2>\d+)\) "
    r"dynamic_shared_memory_size %c(?P<smem>\d+)_i32")
# Register allocation: per warp in units of 256 registers; shared memory in 128-byte units.
_REGISTER_UNIT, _SHARED_UNIT, _MAX_BLOCKS_PER_SM = 256, 128, 32


@dataclasses.dataclass(frozen=True)
class KernelResources:
  """One kernel as compiled for one GPU."""

  name: str
  grid: tuple[int, ...]
  threads: int  # Per block.
  shared_bytes: int  # Per block (Triton's dynamic shared memory).
  registers: int  # Per thread.
  spill_stores: int  # Bytes per thread.
  spill_loads: int
  occupancy: float  # Resident threads / the SM's thread slots, 0..1.
  # The PTX target (None for Triton's: a PTX file of XLA's holds many kernels) and how many of
  # `COUNTED_INSTRUCTIONS` the kernel's PTX holds (`ptx_instructions`).
  ptx: dict | None = None
  # Triton kernels: {bytes per thread: count} of their global loads (`global_load_bytes`).
  load_bytes: dict | None = None

  @property
  def spills(self) -> bool:
    return self.spill_stores > 0 or self.spill_loads > 0


# Hopper's asynchronous warpgroup matmul and its tensor-memory-accelerator (TMA) bulk copies,
# and the warp-level matmul of Ampere (and of Hopper kernels whose tiles fit no warpgroup).
COUNTED_INSTRUCTIONS = {"wgmma": "wgmma.mma_async", "tma": "cp.async.bulk.tensor",
                       "mma_sync": "mma.sync"}
_PTX_TARGET = re.compile(r"^\.target\s+(\S+)", re.MULTILINE)


def ptx_instructions(ptx_text: str) -> dict:
  """`{"target": the .target line's SM, name: count}` for each of `COUNTED_INSTRUCTIONS`: its
  mnemonic where an instruction starts (a line's start, after a predicate such as `@%p24`, or
  after `;` or `{` in the inline-assembly blocks Mosaic writes)."""
  target = _PTX_TARGET.search(ptx_text)
  counts = {name: len(re.findall(r"(?:^|[;{}]|@!?%\w+)\s*" + re.escape(mnemonic) + r"\.",
                                 ptx_text, re.MULTILINE))
            for name, mnemonic in COUNTED_INSTRUCTIONS.items()}
  return {"target": target and target[1], **counts}


_GLOBAL_LOAD = re.compile(r"(?:^|[;{}]|@!?%\w+)\s*ld\.global(?P<mods>(?:\.\w+)*?)"
                          r"\.(?P<type>[bsuf])(?P<bits>\d+)\s", re.MULTILINE)
_ASYNC_COPY = re.compile(r"cp\.async\.c[ag]\.shared\.global\S*\s+\[[^\]]*\],\s*\[[^\]]*\],"
                         r"\s*(?P<bytes>0x[0-9a-f]+|\d+)")


def entry_ptx(ptx_text: str) -> dict[str, str]:
  """Kernel name -> its text, for each `.entry` of a PTX module (XLA's hold many kernels)."""
  starts = [(m.start(), m[1]) for m in re.finditer(r"\.entry\s+(\w+)\s*\(", ptx_text)]
  return {name: ptx_text[start:end] for (start, name), (end, _) in
          zip(starts, [*starts[1:], (len(ptx_text), None)])}


def global_load_bytes(ptx_text: str) -> dict[int, int]:
  """{bytes per thread: count} of the global loads in `ptx_text`: `ld.global` (a vector of
  `.v2`/`.v4` elements or one) and the asynchronous global-to-shared copies (`cp.async`) that
  let Triton pipeline a loop's loads. A kernel whose rows do not start on 16-byte boundaries
  gets element-sized loads (2 bytes in bf16) and no `cp.async`."""
  counts = {}
  for match in _GLOBAL_LOAD.finditer(ptx_text):
    vector = re.search(r"\.v(\d+)", match["mods"])
    size = int(match["bits"]) // 8 * (int(vector[1]) if vector else 1)
    counts[size] = counts.get(size, 0) + 1
  for match in _ASYNC_COPY.finditer(ptx_text):
    size = int(match["bytes"], 0)
    counts[size] = counts.get(size, 0) + 1
  return dict(sorted(counts.items()))


def ptxas_path() -> str | None:
  """The `ptxas` of the `nvidia-cuda-nvcc-cu12` wheel, or None when it is not installed."""
  spec = importlib.util.find_spec("nvidia.cuda_nvcc")
  if spec is None or not spec.submodule_search_locations:
    return None
  path = os.path.join(list(spec.submodule_search_locations)[0], "bin", "ptxas")
  return path if os.path.exists(path) else None


def dump_options(dump_dir: str) -> dict:
  """XLA options for `Lowered.compile` that write each kernel's PTX and the launches."""
  return {"xla_dump_to": dump_dir}


def occupancy(spec: dict, threads: int, registers: int, shared_bytes: int) -> float:
  """Theoretical occupancy of blocks of `threads` threads on an SM of `spec` (a GPU section
  of targets.toml): the fewest blocks that registers, shared memory, threads and the block
  limit allow, times their threads, over the SM's thread slots."""
  warps = math.ceil(threads / spec["threads_per_warp"])
  per_warp = math.ceil(registers * spec["threads_per_warp"] / _REGISTER_UNIT) * _REGISTER_UNIT
  by_registers = spec["registers_per_core_limit"] // max(per_warp * warps, 1)
  shared = math.ceil(shared_bytes / _SHARED_UNIT) * _SHARED_UNIT
  by_shared = spec["shared_memory_per_core"] // shared if shared else _MAX_BLOCKS_PER_SM
  by_threads = spec["threads_per_core_limit"] // threads
  blocks = min(by_registers, by_shared, by_threads, _MAX_BLOCKS_PER_SM)
  return blocks * threads / spec["threads_per_core_limit"]


@contextlib.contextmanager
def mosaic_dump(dump_dir: str):
  """While open, the CUDA plugin writes each Mosaic GPU kernel it compiles into `dump_dir`
  (the plugin reads these variables at every kernel compile)."""
  names = {"MOSAIC_GPU_DUMP_TO": dump_dir, "MOSAIC_GPU_DUMP_PTXAS": "1",
           "MOSAIC_GPU_DUMP_MLIR_PASSES": "1"}
  saved = {name: os.environ.get(name) for name in names}
  os.environ.update(names)
  try:
    yield
  finally:
    for name, value in saved.items():
      if value is None:
        os.environ.pop(name)
      else:
        os.environ[name] = value


def _launches(dump_dir: str, prefix: str) -> dict[str, dict]:
  """Kernel name -> grid, threads, shared memory, from the thunk sequences in `dump_dir`."""
  found = {}
  for path in glob.glob(os.path.join(dump_dir, "*thunk_sequence.txt")):
    with open(path, encoding="utf-8") as f:
      for match in _LAUNCH.finditer(f.read()):
        if match["name"].startswith(prefix):
          found[match["name"]] = {
              "grid": tuple(int(n) for n in match["grid"].split(",")),
              "threads": math.prod(int(n) for n in match["threads"].split(",")),
              "shared_bytes": int(match["smem"])}
  return found


def _ptxas(ptx_path: str, sm: str) -> dict[str, dict]:
  """Kernel name -> registers and spills, from `ptxas -v` on one PTX file."""
  out = subprocess.run([ptxas_path(), f"-arch={sm}", "-v", ptx_path, "-o", os.devnull],
                       capture_output=True, text=True, check=True)
  return _ptxas_report(out.stdout + out.stderr)


def _ptxas_report(text: str) -> dict[str, dict]:
  """Kernel name -> registers and spills, from the text `ptxas -v` prints."""
  reports, name = {}, None
  for line in text.splitlines():
    if entry := _ENTRY.search(line):
      name = entry["name"]
      reports[name] = {}
    elif name and (spills := _SPILLS.search(line)):
      reports[name].update(spill_stores=int(spills["stores"]), spill_loads=int(spills["loads"]))
    elif name and (used := _REGISTERS.search(line)):
      reports[name]["registers"] = int(used["registers"])
  return reports


def kernel_resources(dump_dir: str, target: targets.Target,
                     prefix: str = "cvmm_") -> list[KernelResources]:
  """Every kernel whose name starts with `prefix` in a GPU compile dumped to `dump_dir`
  (`dump_options`), with its ptxas report for `target`'s SM. Raises RuntimeError when ptxas
  is not installed."""
  if ptxas_path() is None:
    raise RuntimeError("ptxas not found: pip install -e \".[compile]\" (nvidia-cuda-nvcc-cu12)")
  launches = _launches(dump_dir, prefix)
  reports, loads, instructions = {}, {}, {}
  for ptx in glob.glob(os.path.join(dump_dir, "*.ptx")):
    with open(ptx, encoding="utf-8") as f:
      entries = {name: text for name, text in entry_ptx(f.read()).items() if name in launches}
    if entries:
      reports.update(_ptxas(ptx, target.sm))
      loads.update({name: global_load_bytes(text) for name, text in entries.items()})
      instructions.update({name: ptx_instructions(text) for name, text in entries.items()})
  return [KernelResources(
      name=name, **launch, **reports[name],
      occupancy=occupancy(target.spec, launch["threads"], reports[name]["registers"],
                          launch["shared_bytes"]), ptx=instructions[name],
      load_bytes=loads[name])
          for name, launch in sorted(launches.items()) if name in reports]


def mosaic_kernel_resources(dump_dir: str, target: targets.Target) -> list[KernelResources]:
  """Every Mosaic GPU kernel the plugin wrote into `dump_dir` (`mosaic_dump`), named after
  its dump file (`mosaic_0`, ... in compile order: the plugin names every kernel
  `anonymous`)."""
  found = []
  for report_path in sorted(glob.glob(os.path.join(dump_dir, "*.ptxas")),
                            key=lambda p: int(re.sub(r"\D", "", os.path.basename(p)) or 0)):
    stem = report_path.removesuffix(".ptxas")
    with open(report_path, encoding="utf-8") as f:
      (report,) = _ptxas_report(f.read()).values()
    launch = _mosaic_launch(stem + ".mlir-passes.log")
    with open(stem + ".ptx", encoding="utf-8") as f:
      ptx = ptx_instructions(f.read())
    found.append(KernelResources(
        name=f"mosaic_{len(found)}", **launch, **report,
        occupancy=occupancy(target.spec, launch["threads"], report["registers"],
                            launch["shared_bytes"]), ptx=ptx))
  return found


def _mosaic_launch(log_path: str) -> dict:
  """Grid, threads and dynamic shared memory of the `gpu.launch` in a Mosaic MLIR log."""
  with open(log_path, encoding="utf-8") as f:
    for line in f:
      if match := _MOSAIC_LAUNCH.search(line):
        return {"grid": tuple(int(match[f"g{i}"]) for i in range(3)),
                "threads": math.prod(int(match[f"t{i}"]) for i in range(3)),
                "shared_bytes": int(match["smem"])}
  raise ValueError(f"no gpu.launch in {log_path}")
