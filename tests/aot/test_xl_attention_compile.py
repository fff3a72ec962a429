"""The fused Transformer-XL attention (`pallas_kernels.xl_attention`, issue 60) compiled for an
H100 (sm_90) and an A100 (sm_80) on CPU: value and all gradients (a traced, learned scale
included) in bf16 (and f32, kernels only) at the WT-103 S layer shape (10 heads of 41, T 256,
memory 256; batch 8 instead of 64 to stay quick).

The compiled program must hold the three kernels, and no float32 tensor of B H T K elements
(the scores the XLA path writes, which it does hold: checked too, so the search is not
vacuous); the kernels must not spill, and must load their tiles 16 bytes at a time.
"""

import math
import re

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

from pallas_kernels.xl_attention import xl_attention, xl_attention_reference
from sparse_jax.aot import kernel_resources, targets
from aot_testing import needs_gpu

B, H, T, M, DH = 8, 10, 256, 256, 41
K = M + T
_KERNELS = ("xl_attention_forward", "xl_attention_dkdv", "xl_attention_dq")


def _loss(q_u, q_v, k, v, r, scale, mem_valid, *, fused):
  attend = xl_attention if fused else xl_attention_reference
  return jnp.sum(attend(q_u, q_v, k, v, r, scale, mem_valid).astype(jnp.float32))


def _compile(target_name: str, fused: bool, options=None, dtype=jnp.bfloat16):
  target = targets.parse_target(target_name)
  mesh = targets.one_device_mesh(target)
  sharding = NamedSharding(mesh, P())
  shapes = [((B, T, H, DH), dtype)] * 2 + [((B, K, H, DH), dtype)] * 2 + [
      ((K, H, DH), dtype), ((), jnp.float32), ((), jnp.int32)]
  args = [jax.ShapeDtypeStruct(s, t, sharding=sharding) for s, t in shapes]
  grads = jax.jit(jax.grad(lambda *a: _loss(*a, fused=fused), argnums=tuple(range(6))))
  with jax.set_mesh(mesh):
    lowered = grads.trace(*args).lower(lowering_platforms=(target.lowering_platform,))
    return lowered.compile(options) if options else lowered.compile()


def _f32_score_tensors(hlo: str) -> list[str]:
  """Shapes of float32 tensors with B H T K elements (the scores) in the HLO text."""
  found = set()
  for dims in re.findall(r"f32\[([\d,]+)\]", hlo):
    if math.prod(int(x) for x in dims.split(",")) == B * H * T * K:
      found.add(dims)
  return sorted(found)


@needs_gpu
@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float32])
@pytest.mark.parametrize("target_name", ["h100", "a100"])
def test_fused_xl_attention_compiles_without_f32_scores_and_spills(target_name, dtype,
                                                                   tmp_path):
  """In float32 the position scores P and their gradient are float32 [B, H, T, K] by design
  (the compute dtype): only the kernels are checked there."""
  target = targets.parse_target(target_name)
  compiled = _compile(target_name, True, kernel_resources.dump_options(str(tmp_path)), dtype)
  hlo = compiled.as_text()
  for kernel in _KERNELS:
    assert kernel in hlo, f"{kernel} missing for {target_name}"
  if dtype == jnp.bfloat16:
    assert not _f32_score_tensors(hlo), _f32_score_tensors(hlo)
  found = kernel_resources.kernel_resources(str(tmp_path), target, prefix="xl_attention")
  assert {k.name for k in found} >= set(_KERNELS), found
  for kernel in found:
    assert not kernel.spills, kernel
    assert 0 < kernel.registers <= 255 and kernel.occupancy > 0, kernel
    assert kernel.shared_bytes <= target.spec["shared_memory_per_block_optin"], kernel
    # Heads padded to whole 16-byte vectors and P's rows aligned (`PositionLayout`): q, k, v
    # and P load 16 bytes at a time, pipelined by cp.async; unpadded, every tile load of the
    # 41-wide heads was element by element (2 bytes in bf16) and none was asynchronous.
    assert dtype == jnp.float32 or 2 not in kernel.load_bytes, kernel
    assert kernel.load_bytes.get(16, 0) >= 8, kernel


@needs_gpu
def test_the_xla_path_holds_f32_scores():
  """The search above finds the scores of the XLA path, which writes them."""
  assert _f32_score_tensors(_compile("h100", False).as_text())
