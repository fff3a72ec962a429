"""The roofline of a benchmarked call: the fastest its FLOPs and its bytes allow on a device.

    bound_s = max(flops / peak_flops(dtype), bytes / hbm_bandwidth)

`bytes` is a lower bound on the call's HBM traffic (`min_bytes`): every input read once and
every output written once, intermediates assumed to stay on chip. Our MoE shapes (G = 128)
sit near or below the H100's balance point of ~295 FLOP/byte, so judging a kernel by % of
peak FLOP/s alone would call a memory-bound kernel slow; the achieved fraction of this bound
is the fair score (1.0 = at the roofline).

Peaks are the vendors' dense (no 2:4 sparsity) figures, looked up by `device_kind`; an
unknown device has none and its roofline columns read "n/a". The float32 peak is the
non-tensor-core FMA rate, since our f32 products run at precision HIGHEST (IEEE f32, not TF32).
"""

import dataclasses
import time

import jax
import jax.numpy as jnp


@dataclasses.dataclass(frozen=True)
class DevicePeaks:
  """Peak dense throughput per dtype name (TFLOP/s) and HBM bandwidth (TB/s) of a device."""
  name: str
  tflops: dict[str, float]
  hbm_tb_s: float


PEAKS = {  # jax.Device.device_kind -> its peaks
    "NVIDIA H100 80GB HBM3": DevicePeaks("H100 SXM", {"bfloat16": 989.0, "float32": 67.0}, 3.35),
    "NVIDIA H200": DevicePeaks("H200 SXM", {"bfloat16": 989.0, "float32": 67.0}, 4.8),
}


def device_peaks(device_kind: str) -> DevicePeaks | None:
  """The peaks of a known device, None for any other."""
  return PEAKS.get(device_kind)


def min_bytes(args, outputs) -> int:
  """Bytes of every array in `args` and `outputs`: each input read once, each output written
  once (a lower bound on HBM traffic)."""
  return sum(leaf.nbytes for leaf in jax.tree.leaves((args, outputs)))


def tflops(flops: float, ms: float) -> float:
  """Achieved TFLOP/s of `flops` done in `ms` milliseconds."""
  return flops / ms / 1e9


def bound_us(peaks: DevicePeaks | None, dtype: str, flops: float, num_bytes: float) -> float | None:
  """The roofline time in microseconds, max(compute time, memory time); None if unknown."""
  if peaks is None or dtype not in peaks.tflops:
    return None
  return max(flops / (peaks.tflops[dtype] * 1e12), num_bytes / (peaks.hbm_tb_s * 1e12)) * 1e6


def _best_s(fn, *args, repeats: int) -> float:
  jax.block_until_ready(fn(*args))
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    jax.block_until_ready(fn(*args))
    times.append(time.perf_counter() - start)
  return min(times)


def measured_peaks(mib: int = 1024, matmul_n: int = 2048, repeats: int = 10) -> dict:
  """This device's own float32 peaks, measured now (for devices `PEAKS` lacks, e.g. a CPU):

  - `read_gb_s`: a jitted sum over `mib` MiB, every byte read once (what decoding's weight
    reads need; the bound uses it);
  - `copy_gb_s`: a jitted, in-place `x + 1` over the same array, counted as read plus write;
  - `matmul_gflop_s`: an `n x n x n` float32 matmul at precision HIGHEST.
  The fastest of `repeats` calls after a warm-up (a peak is what the machine can do; shared
  VMs drift by tens of percent); run in the same process as what they bound.
  """
  x = jnp.ones((mib * 2 ** 20 // 4,), jnp.float32)
  read_s = _best_s(jax.jit(jnp.sum), x, repeats=repeats)
  add_one = jax.jit(lambda a: a + 1, donate_argnums=0)  # In place: no page faults timed.
  copy_times = []
  for _ in range(repeats + 1):
    start = time.perf_counter()
    x = jax.block_until_ready(add_one(x))
    copy_times.append(time.perf_counter() - start)
  copy_s = min(copy_times[1:])
  del x
  a = jnp.ones((matmul_n, matmul_n), jnp.float32)
  matmul = jax.jit(lambda a, b: jnp.matmul(a, b, precision="highest"))
  matmul_s = _best_s(matmul, a, a, repeats=repeats)
  nbytes = mib * 2 ** 20
  return {"read_gb_s": nbytes / read_s / 1e9, "copy_gb_s": 2 * nbytes / copy_s / 1e9,
          "matmul_gflop_s": 2 * matmul_n ** 3 / matmul_s / 1e9}
