"""The Pallas kernels lower to Triton at the paper's shapes, checked on CPU.

Tracing inside an abstract mesh whose device is an H100 makes `cvmm(impl="auto")` pick the
Triton kernels, and `lower(lowering_platforms=("cuda",))` runs the Pallas -> Triton lowering
(block shapes, dot operand sizes, masks) without a GPU. Shapes only: no data is created.
"""

import re

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import AbstractDevice, AbstractMesh

from pallas_kernels import cvmm

TOKENS, D_MODEL, GROUP, K, EXPERTS = 32768, 512, 128, 4, 32
_H100 = AbstractMesh((1,), ("x",), abstract_device=AbstractDevice(
    device_kind="NVIDIA H100 80GB HBM3", num_cores=132, platform="gpu"))


def _moe_loss(x_nd, sel_nk, gates_nk, w1_edg, w2_egd):
  """sigma-MoE layer: up projection with shared token rows, ReLU, gated down projection."""
  h_nkg = jax.nn.relu(cvmm(x_nd, sel_nk, w1_edg))
  return jnp.sum(cvmm(h_nkg, sel_nk, w2_egd, gates_nk).astype(jnp.float32))


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=lambda d: jnp.dtype(d).name)
def test_forward_and_backward_lower_to_triton(dtype):
  shapes = (jax.ShapeDtypeStruct((TOKENS, D_MODEL), dtype),
            jax.ShapeDtypeStruct((TOKENS, K), jnp.int32),
            jax.ShapeDtypeStruct((TOKENS, K), dtype),
            jax.ShapeDtypeStruct((EXPERTS, D_MODEL, GROUP), dtype),
            jax.ShapeDtypeStruct((EXPERTS, GROUP, D_MODEL), dtype))
  train_step = jax.value_and_grad(_moe_loss, argnums=(0, 2, 3, 4))
  with jax.sharding.use_abstract_mesh(_H100):
    hlo = jax.jit(train_step).trace(*shapes).lower(lowering_platforms=("cuda",)).as_text()
  triton_calls = re.findall(r"custom_call @__gpu\$xla\.gpu\.triton", hlo)
  # Forward of 2 cvmms, input gradient of 2, weight gradient of 2 (identical kernels may be
  # shared as one private function, so count distinct kernels by name as well).
  assert len(triton_calls) >= 4, hlo[:2000]
  assert "cvmm_segment_matmul" in hlo and "cvmm_weight_grad" in hlo
  assert "mosaic" not in hlo.lower(), "the kernels must go to Triton, not Mosaic GPU"
