"""Model FLOPs per second and model FLOPs utilisation (MFU) of the training step.

Every train line of `metrics.jsonl` carries

    tflops_per_device = flops_per_step * steps / seconds / n_devices / 1e12
    mfu               = tflops_per_device / peak_tflops(device kind, compute dtype)

`flops_per_step` is the task's model FLOPs (`models.accounting`: 2 per multiply-add of the
selected experts and kept units, the backward pass where gradients flow, no recomputation);
`mfu` appears only where the device's peak is known (`PEAK_TFLOPS`; not on CPUs).

Peaks are the vendors' dense figures (the datasheets quote GPU tensor-core rates with 2:4
sparsity, twice these). A float32 model divides by the TF32 peak on GPUs, since JAX runs float32
matmuls there as TF32 by default (`jax_default_matmul_precision="highest"` runs true float32 at
a fraction of it: MFU then reads low), and by the bfloat16 peak on TPUs, whose default
precision takes one bfloat16 pass.
"""

import dataclasses
import re

from jax.sharding import Mesh

# (device_kind pattern, searched case-insensitively; first match wins): {dtype: TFLOP/s}.
PEAK_TFLOPS = (
    # NVIDIA H100 datasheet: PCIe 1,513 (BF16) / 756 (TF32) with sparsity; NVL 1,671 / 835;
    # SXM 1,979 / 989.
    (r"h100.*pcie", {"bfloat16": 756.5, "float32": 378.0}),
    (r"h100.*nvl", {"bfloat16": 835.5, "float32": 417.5}),
    (r"h100", {"bfloat16": 989.4, "float32": 494.7}),
    # NVIDIA H200 datasheet: NVL 1,671 / 835 with sparsity; SXM 1,979 / 989 (as H100 SXM).
    (r"h200.*nvl", {"bfloat16": 835.5, "float32": 417.5}),
    (r"h200", {"bfloat16": 989.4, "float32": 494.7}),
    # NVIDIA A100 datasheet (SXM and PCIe, 40 and 80 GB): 312 (BF16), 156 (TF32) dense.
    (r"a100", {"bfloat16": 312.0, "float32": 156.0}),
    # Google Cloud TPU system architecture pages, bf16 per chip: v4 275, v5e 197, v5p 459,
    # v6e (Trillium) 918. JAX names them "TPU v4", "TPU v5 lite", "TPU v5p", "TPU v6 lite".
    (r"^tpu v4$", {"bfloat16": 275.0, "float32": 275.0}),
    (r"^tpu v5( lite|e)$", {"bfloat16": 197.0, "float32": 197.0}),
    (r"^tpu v5p?$", {"bfloat16": 459.0, "float32": 459.0}),
    (r"^tpu v6( lite|e)$", {"bfloat16": 918.0, "float32": 918.0}),
)


def peak_tflops(device_kind: str, dtype: str) -> float | None:
  """Dense peak TFLOP/s of one device of `device_kind` (`jax.Device.device_kind`) computing in
  `dtype` ("float32", "bfloat16"); None where unknown (CPUs, other accelerators)."""
  for pattern, peaks in PEAK_TFLOPS:
    if re.search(pattern, device_kind.strip(), re.IGNORECASE):
      return peaks.get(dtype)
  return None


@dataclasses.dataclass(frozen=True)
class ModelFlopsRate:
  """Turns a logging window's step rate into `tflops_per_device` and `mfu` (module
  docstring)."""

  flops_per_step: int
  n_devices: int
  peak_tflops: float | None  # Per device; None: no `mfu`.

  @classmethod
  def of(cls, flops_per_step: int, compute_dtype: str, mesh: Mesh) -> "ModelFlopsRate":
    """For a step of `flops_per_step` on every device of `mesh`, whose first device's kind
    and `compute_dtype` pick the peak."""
    kind = mesh.devices.flat[0].device_kind
    return cls(flops_per_step, mesh.devices.size, peak_tflops(kind, compute_dtype))

  def metrics(self, steps_per_second: float) -> dict[str, float]:
    tflops = self.flops_per_step * steps_per_second / self.n_devices / 1e12
    if self.peak_tflops is None:
      return {"tflops_per_device": tflops}
    return {"tflops_per_device": tflops, "mfu": tflops / self.peak_tflops}
