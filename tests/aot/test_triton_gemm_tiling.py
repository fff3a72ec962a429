"""The Triton GEMM tiling failure of XLA:GPU (`training.xla_fallbacks`), reproduced in one
einsum, compiled for an H100 and an A100 on CPU, and the fallback that makes it compile; and
our Transformer-XL attention's gradient at the paper's WT-103 S shapes, which hit the failure
until its K and V became one product (2026-12-05) and now compiles with the defaults."""

import re

import jax
import jax.numpy as jnp
import pytest
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec as P

from sparse_jax.aot import targets
from sparse_jax.layers.xl_attention import RelativeMultiHeadAttention
from sparse_jax.training import xla_fallbacks
from aot_testing import needs_gpu

B, K, H, D = 64, 512, 10, 412  # WT-103 S: batch 64, memory + segment 512, 10 heads, d 412.
_TRITON_GEMM = re.compile(r'"kind":"__triton\w*gemm\w*"')  # The fusion kinds XLA names them.
_CUBLAS = re.compile(r'custom_call_target="__cublas')


def _lower(target_name: str, fn, *shapes) -> jax.stages.Lowered:
  target = targets.parse_target(target_name)
  mesh = targets.one_device_mesh(target)
  replicated = NamedSharding(mesh, P())
  args = [jax.ShapeDtypeStruct(s, jnp.float32, sharding=replicated) for s in shapes]
  with jax.set_mesh(mesh):
    return jax.jit(fn).trace(*args).lower(lowering_platforms=(target.lowering_platform,))


def _head_merge(head_dim: int):
  """`[b, h, c, k]` contracted over (h, c): XLA fuses the transpose into the Triton GEMM,
  splitting its contracting dimension into h and c."""
  return (lambda a, w: jnp.einsum("bhck,hcd->bkd", a, w), (B, H, head_dim, K), (H, head_dim, D))


@needs_gpu
@pytest.mark.parametrize("target_name", ["h100", "a100"])
@pytest.mark.parametrize("head_dim", [41, 40])
def test_a_head_dim_no_k_tile_divides_fails_and_the_fallback_compiles(target_name, head_dim):
  lowered = _lower(target_name, *_head_merge(head_dim))
  with pytest.raises(jax.errors.JaxRuntimeError, match=xla_fallbacks.TRITON_GEMM_TILING_ERROR):
    lowered.compile()
  compiled, options = xla_fallbacks.compile_lowered(lowered, "gpu")
  assert options == xla_fallbacks.NO_TRITON_GEMM
  program = compiled.as_text()
  assert not _TRITON_GEMM.search(program) and _CUBLAS.search(program)


@needs_gpu
@pytest.mark.parametrize("head_dim", [32, 48, 64])
def test_head_dims_a_k_tile_divides_compile_with_the_defaults(head_dim):
  compiled, options = xla_fallbacks.compile_lowered(_lower("h100", *_head_merge(head_dim)), "gpu")
  assert options == {}
  assert _TRITON_GEMM.search(compiled.as_text())


@needs_gpu
def test_the_xl_attention_gradient_at_wt103_s_shapes_compiles_without_the_fallback():
  attention = RelativeMultiHeadAttention(D, H, 41, n_layers=16, impl="xla", rngs=nnx.Rngs(0))
  graphdef, state = nnx.split(attention)
  t = K // 2

  def loss(x_btd, memory_bmd):
    ctx_bkd = jnp.concatenate([jax.lax.stop_gradient(memory_bmd), x_btd], axis=1)
    return jnp.sum(nnx.merge(graphdef, state)(ctx_bkd, t, jnp.int32(K - t)))

  lowered = _lower("h100", jax.grad(loss), (B, t, D), (B, K - t, D))
  compiled, options = xla_fallbacks.compile_lowered(lowered, "gpu")
  assert options == {}  # The defaults compile it: XLA's Triton GEMMs stay on.
  assert _TRITON_GEMM.search(compiled.as_text())
