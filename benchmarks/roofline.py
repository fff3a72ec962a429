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

import jax


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
