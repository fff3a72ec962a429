"""`training.xla_fallbacks.compile_lowered` decides when to retry, on CPU with stand-ins for
a lowered program (the real GPU failure: tests/aot/test_triton_gemm_tiling.py)."""

import jax
import pytest

from sparse_jax.training import xla_fallbacks


class _Lowered:
  """Fails its default compile with `error`; records the options of each compile."""

  def __init__(self, error: str):
    self.error, self.calls = error, []

  def compile(self, options=None):
    self.calls.append(options)
    if options is None:
      raise jax.errors.JaxRuntimeError(self.error)
    return "compiled"


_TILING = ("INTERNAL: Couldn't find output tile sizes that satisfy hlo: %dot.31 = "
           "f32[32768,412]{1,0} dot(%bitcast.63, %parameter_1.7)")


def test_a_gpu_tiling_failure_is_retried_without_triton_gemms():
  lowered = _Lowered(_TILING)
  assert xla_fallbacks.compile_lowered(lowered, "gpu") == ("compiled",
                                                           xla_fallbacks.NO_TRITON_GEMM)
  assert lowered.calls == [None, xla_fallbacks.NO_TRITON_GEMM]


@pytest.mark.parametrize("error,platform", [(_TILING, "tpu"), (_TILING, "cpu"),
                                            ("RESOURCE_EXHAUSTED: out of memory", "gpu")])
def test_other_failures_are_the_compilers(error, platform):
  lowered = _Lowered(error)
  with pytest.raises(jax.errors.JaxRuntimeError, match=error.split(":")[0]):
    xla_fallbacks.compile_lowered(lowered, platform)
  assert lowered.calls == [None]


def test_a_program_that_compiles_gets_no_options():
  compiled, options = xla_fallbacks.compile_lowered(jax.jit(lambda x: x + 1).lower(1.0), "cpu")
  assert options == {} and compiled(1.0) == 2.0
