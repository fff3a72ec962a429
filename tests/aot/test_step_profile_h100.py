"""benchmarks/step_profile.py --deviceless=h100: the breakdown of a tiny sigma-MoE model's
training step compiled for an H100 on this CPU (needs the compile extra; skipped without).
XLA:GPU's program has cuBLAS or Triton GEMMs, our Triton grouped-matmul kernels, and XLA's
fusions; every launch lands in a category and the categories add up."""

import json
import pathlib

import pytest

from aot_testing import needs_gpu
from benchmarks import step_profile

CONFIG = pathlib.Path(__file__).with_name("tiny_moe_config.py")


@needs_gpu
def test_deviceless_breakdown_of_a_step_compiled_for_an_h100(tmp_path):
  report = step_profile.main([f"--config={CONFIG}", "--config.model.dtype=bfloat16",
                              "--deviceless=h100", f"--out={tmp_path}",
                              f"--save_hlo={tmp_path / 'step.hlo.txt'}"])
  assert report["mode"] == "deviceless" and report["target"] == "h100"
  assert report["peaks"]["tflops"]["bfloat16"] == 989.0
  module = step_profile.parse_hlo((tmp_path / "step.hlo.txt").read_text())
  categories, total = report["categories"], report["total"]
  for key in ("floor_ms", "flops", "bytes", "launches"):
    assert sum(c[key] for c in categories) == pytest.approx(total[key])
  assert total["launches"] == sum(times for _, times in step_profile.launches(module))
  floor = {c["category"]: c["floor_ms"] for c in categories}
  for category in ("matmuls", "attention", "moe", "optimizer", "norms_elementwise"):
    assert floor[category] > 0, category
  # Our grouped-matmul kernels are Triton custom calls with their FLOPs counted, in MoE.
  kernels = {kind: n for kind, n in report["launch_kinds"].items() if "triton" in kind}
  assert kernels and all(n > 0 for n in kernels.values())
  moe = next(c for c in categories if c["category"] == "moe")
  assert moe["flops"] > 0
  written = json.loads((tmp_path / "step_profile_tiny_moe_config_h100_deviceless.json")
                       .read_text())
  assert written["total"] == total
  markdown = (tmp_path / "step_profile_tiny_moe_config_h100_deviceless.md").read_text()
  assert "| **total** |" in markdown and "Pad fusions:" in markdown
  assert report["compile_s"] > 0 and report["memory"]["total_bytes"] > 0
  assert "Traced and compiled in" in markdown


@needs_gpu
def test_scanned_layers_compile_for_an_h100_with_every_kernel_in_the_loop(tmp_path):
  """`model.scan_layers` with the GPU's kernels inside the scan (Triton cvmm, the fused XL
  attention): it compiles for an H100, every loop has a known trip count, and counted by trip
  count the step launches our kernels as often as the unrolled step does."""
  def report(scan: bool):
    return step_profile.main([f"--config={CONFIG}", "--config.model.dtype=bfloat16",
                              f"--config.model.scan_layers={scan}", "--deviceless=h100",
                              f"--name=tiny_{scan}", f"--out={tmp_path}",
                              f"--save_hlo={tmp_path / f'{scan}.hlo.txt'}"])

  unrolled, scanned = report(False), report(True)
  assert " while(" in (tmp_path / "True.hlo.txt").read_text()
  assert " while(" not in (tmp_path / "False.hlo.txt").read_text()
  assert not scanned.get("unknown_trip_counts")
  triton = {kind: n for kind, n in unrolled["launch_kinds"].items() if "triton" in kind}
  assert triton and triton == {kind: scanned["launch_kinds"][kind] for kind in triton}
