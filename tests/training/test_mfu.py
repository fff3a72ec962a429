"""`training.mfu`: the peak of each device kind JAX reports, and the logged fields."""

import jax
import numpy as np
import pytest
from jax.sharding import Mesh

from sparse_jax.training.mfu import ModelFlopsRate, peak_tflops


@pytest.mark.parametrize("device_kind, dtype, peak", [
    ("NVIDIA H100 80GB HBM3", "bfloat16", 989.4),  # SXM
    ("NVIDIA H100 80GB HBM3", "float32", 494.7),  # TF32
    ("NVIDIA H100 PCIe", "bfloat16", 756.5),
    ("NVIDIA H100 NVL", "float32", 417.5),
    ("NVIDIA H200", "bfloat16", 989.4),
    ("NVIDIA A100-SXM4-80GB", "float32", 156.0),
    ("NVIDIA A100-PCIE-40GB", "bfloat16", 312.0),
    ("TPU v4", "bfloat16", 275.0),
    ("TPU v5 lite", "float32", 197.0),
    ("TPU v5e", "bfloat16", 197.0),
    ("TPU v5p", "bfloat16", 459.0),
    ("TPU v5", "bfloat16", 459.0),
    ("TPU v6 lite", "bfloat16", 918.0),
])
def test_peaks_of_known_devices(device_kind, dtype, peak):
  assert peak_tflops(device_kind, dtype) == peak


@pytest.mark.parametrize("device_kind", ["cpu", "TPU v4 lite", "Tesla V100-SXM2-16GB"])
def test_unknown_devices_have_no_peak(device_kind):
  assert peak_tflops(device_kind, "bfloat16") is None


def test_tflops_per_device_and_mfu():
  rate = ModelFlopsRate(flops_per_step=6e12, n_devices=4, peak_tflops=500.0)
  assert rate.metrics(steps_per_second=2.0) == pytest.approx(
      {"tflops_per_device": 3.0, "mfu": 3.0 / 500.0})


def test_on_cpu_only_tflops_are_logged():
  mesh = Mesh(np.array(jax.devices()[:2]), ("data",))
  rate = ModelFlopsRate.of(10**12, "float32", mesh)
  assert (rate.n_devices, rate.peak_tflops) == (2, None)
  assert rate.metrics(1.0) == {"tflops_per_device": 0.5}
