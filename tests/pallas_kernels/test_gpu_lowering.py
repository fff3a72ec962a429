"""The Pallas kernels lower for an H100 at the paper's shapes, checked on CPU.

Tracing inside an abstract mesh whose device is an H100 makes `cvmm` and `expert_mlp` pick the GPU kernels
(`impl="auto"`: Triton; `impl="mosaic"`: Mosaic GPU), and `lower(lowering_platforms=("cuda",))`
runs the Pallas -> Triton and Pallas -> Mosaic GPU lowerings (block shapes, dot operand
sizes, pipelines, masks) without a GPU. Shapes only: no data is created.
"""

import re

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import AbstractDevice, AbstractMesh

from pallas_kernels import cvmm, expert_mlp, mosaic_matmul, mosaic_weight_grad, slot_layout

TOKENS, D_MODEL, GROUP, K, EXPERTS = 32768, 512, 128, 4, 32
_H100 = AbstractMesh((1,), ("x",), abstract_device=AbstractDevice(
    device_kind="NVIDIA H100 80GB HBM3", num_cores=132, platform="gpu"))
_TRITON_CALL = r"custom_call @__gpu\$xla\.gpu\.triton"
_MOSAIC_CALL = r"custom_call @mosaic_gpu_v2"


def _moe_loss(x_nd, sel_nk, gates_nk, w1_edg, w2_egd, impl):
  """sigma-MoE layer: up projection with shared token rows, ReLU, gated down projection."""
  h_nkg = jax.nn.relu(cvmm(x_nd, sel_nk, w1_edg, impl=impl))
  return jnp.sum(cvmm(h_nkg, sel_nk, w2_egd, gates_nk, impl=impl).astype(jnp.float32))


def _fused_moe_loss(x_nd, sel_nk, gates_nk, w1_edg, w2_egd, impl):
  """The same layer through `expert_mlp` (one layout for both projections)."""
  return jnp.sum(expert_mlp(x_nd, sel_nk, gates_nk, w1_edg, w2_egd, impl=impl).astype(
      jnp.float32))


def _lowered_train_step(dtype, impl: str, d_model: int = D_MODEL, loss=_moe_loss,
                        tokens: int = TOKENS, k: int = K) -> str:
  """StableHLO text of the MoE layer's value and gradients (x, gates, both weights)."""
  shapes = (jax.ShapeDtypeStruct((tokens, d_model), dtype),
            jax.ShapeDtypeStruct((tokens, k), jnp.int32),
            jax.ShapeDtypeStruct((tokens, k), dtype),
            jax.ShapeDtypeStruct((EXPERTS, d_model, GROUP), dtype),
            jax.ShapeDtypeStruct((EXPERTS, GROUP, d_model), dtype))
  train_step = jax.value_and_grad(loss, argnums=(0, 2, 3, 4))
  with jax.sharding.use_abstract_mesh(_H100):
    traced = jax.jit(train_step, static_argnums=5).trace(*shapes, impl)
    return traced.lower(lowering_platforms=("cuda",)).as_text()


@pytest.mark.parametrize("loss", [_moe_loss, _fused_moe_loss], ids=["cvmm", "expert_mlp"])
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=lambda d: jnp.dtype(d).name)
def test_forward_and_backward_lower_to_triton(dtype, loss):
  hlo = _lowered_train_step(dtype, "auto", loss=loss)
  # Forward of 2 cvmms, input gradient of 2, weight gradient of 2 (identical kernels may be
  # shared as one private function, so count distinct kernels by name as well).
  assert len(re.findall(_TRITON_CALL, hlo)) >= 4, hlo[:2000]
  assert "cvmm_segment_matmul" in hlo and "cvmm_weight_grad" in hlo
  assert not re.search(_MOSAIC_CALL, hlo), "auto must keep the Triton kernels"


def _token_row_copies(hlo: str, tokens: int = TOKENS, k: int = K) -> list[str]:
  """The StableHLO gathers of a token-shared [N, width] array into [N k, width] slot rows."""
  pattern = (rf'"stablehlo\.gather".*: \(tensor<{tokens}x(\d+)x\w+>, '
             rf'tensor<{tokens * k}x1xi32>\) -> tensor<{tokens * k}x\1x')
  return [line for line in hlo.splitlines() if re.search(pattern, line)]


@pytest.mark.parametrize("loss", [_moe_loss, _fused_moe_loss], ids=["cvmm", "expert_mlp"])
def test_triton_kernels_read_token_rows_through_the_index(loss):
  """Issue 59: on the GPU path the Triton kernels load the token rows k slots share (x, and
  the cotangent of a gated sum) through the sorted index; no [N k, d] copy is made in XLA.
  The Mosaic kernels still take copies, which shows what the search finds."""
  assert not _token_row_copies(_lowered_train_step(jnp.bfloat16, "auto", loss=loss))
  assert len(_token_row_copies(_lowered_train_step(jnp.bfloat16, "mosaic", loss=loss))) >= 2


@pytest.mark.parametrize("loss", [_moe_loss, _fused_moe_loss], ids=["cvmm", "expert_mlp"])
@pytest.mark.parametrize("d_model", [512, 1024])
def test_forward_and_backward_lower_to_mosaic_gpu(d_model, loss):
  hlo = _lowered_train_step(jnp.bfloat16, "mosaic", d_model, loss)
  # Two forward matmuls, two input gradients (on w read transposed) and two weight gradients;
  # only the XLA glue (sort, gathers) is left outside the kernels.
  assert len(re.findall(_MOSAIC_CALL, hlo)) == 6, hlo[:2000]
  assert not re.search(_TRITON_CALL, hlo)
  assert not re.search(r"stablehlo\.(dot_general|ragged_dot)", hlo), "a matmul left in XLA"


@pytest.mark.parametrize("tokens, k", [(70, 1), (130, 2)])
def test_mosaic_lowers_for_row_counts_off_the_tma_tiling(tokens, k):
  """70 and 260 slot rows: TMA refused them (an H200, 2026-11-25) until the kernels padded
  their row arrays to a multiple of 8."""
  hlo = _lowered_train_step(jnp.bfloat16, "mosaic", loss=_fused_moe_loss, tokens=tokens, k=k)
  assert len(re.findall(_MOSAIC_CALL, hlo)) == 6, hlo[:2000]


def test_mosaic_refuses_float32_and_odd_sizes():
  with pytest.raises(ValueError, match="use impl='pallas' for float32"):
    _lowered_train_step(jnp.float32, "mosaic")
  with pytest.raises(ValueError, match="needs M to be a multiple of 64, got 552"):
    _lowered_train_step(jnp.bfloat16, "mosaic", d_model=552)


def test_mosaic_refuses_tiles_that_do_not_divide_the_matrix():
  """A 256-wide tile on N = 128 once ran as no work at all (block sweep on an H200)."""
  x = jnp.zeros((16, 64), jnp.bfloat16)
  groups = slot_layout.sorted_layout(jnp.zeros((16,), jnp.int32), 2).groups
  with pytest.raises(ValueError, match="blocks.cols=256 must divide N=128"):
    mosaic_matmul.segment_matmul(x, jnp.zeros((2, 64, 128), jnp.bfloat16), groups,
                                 transpose_w=False, out_dtype=jnp.bfloat16,
                                 blocks=mosaic_matmul.MatmulBlocks(64, 256, 64, 4))
  with pytest.raises(ValueError, match="blocks.rows_m=128 must divide M=64"):
    mosaic_weight_grad.weight_grad(x, jnp.zeros((16, 128), jnp.bfloat16), groups,
                                   out_dtype=jnp.bfloat16,
                                   blocks=mosaic_weight_grad.WeightGradBlocks(128, 128, 64, 4))
