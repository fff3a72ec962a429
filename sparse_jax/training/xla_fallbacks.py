"""Compiling a step with the XLA options it needs: none, except where XLA:GPU fails.

XLA:GPU fuses an operand's transpose into a Triton GEMM. When that transpose splits the
contracting dimension into two non-adjacent ones whose inner size no K-tile divides, the
emitter finds no tiling and the compile stops:

    INTERNAL: Couldn't find output tile sizes that satisfy hlo: %dot = f32[32768,412] dot(...)

Our Transformer-XL attention at the sigma-MoE paper's WT-103 S/S* shapes (10 heads of 41)
meets it in the input gradient of the K/V projections, whose incoming gradient XLA lays out
as `[b, h, c, k]`; the smallest reproducer is one einsum (`tests/aot/test_triton_gemm_tiling.py`):

    jnp.einsum("bhck,hcd->bkd", a_bhck, w_hcd)   # c = 41 or 40 fails; 32, 48, 64 compile

with b*k = 32768 and h >= 2, compiled for sm_90a or sm_80 without a device (XLA then takes a
default tiling, as it does not autotune). Whether XLA's autotuner on a real GPU finds a
tiling (or falls back to cuBLAS) is not known. `compile_lowered` retries such a compile with
`xla_gpu_enable_triton_gemm=false`, a documented XLA flag that sends that program's dots to
cuBLAS; only GPU compiles that failed this way get it, so every other program keeps XLA's
defaults.
"""

import jax

TRITON_GEMM_TILING_ERROR = "Couldn't find output tile sizes"
NO_TRITON_GEMM = {"xla_gpu_enable_triton_gemm": False}


def compile_lowered(lowered: jax.stages.Lowered, platform: str
                    ) -> tuple[jax.stages.Compiled, dict]:
  """`lowered` compiled for `platform` ("gpu", "tpu", "cpu"), and the XLA options it took:
  `{}`, or `NO_TRITON_GEMM` for a GPU program whose Triton GEMM found no tiling."""
  try:
    return lowered.compile(), {}
  except jax.errors.JaxRuntimeError as e:
    if platform != "gpu" or TRITON_GEMM_TILING_ERROR not in str(e):
      raise
  return lowered.compile(NO_TRITON_GEMM), dict(NO_TRITON_GEMM)
