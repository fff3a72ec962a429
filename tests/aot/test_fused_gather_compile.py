"""The Triton kernels that read token rows through the sorted index (issue 59), compiled for an
H100 (sm_90) and an A100 (sm_80) on CPU: XLA's GPU compiler, Triton and ptxas.

The compiled MoE layer (value and all gradients, bf16) must hold our kernels, no gather of
token rows into [N k, d] slot rows, and fewer temporary bytes than the same program with the
Triton backend told to take copies (what it compiled to before), by at least one such copy.
Registers and spills of every Triton kernel, these included, are checked by
test_compile_targets.py::test_triton_kernels_do_not_spill.
"""

import dataclasses
import re

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

from pallas_kernels import backends, cvmm, expert_mlp
from sparse_jax.aot import memory, targets
from aot_testing import needs_gpu

N, D, G, K, E = 2048, 256, 128, 4, 32  # tokens, d_model, expert size, k, experts


def _loss(x_nd, sel_nk, gates_nk, w1_edg, w2_egd, *, op):
  if op == "cvmm":
    h_nkg = jax.nn.relu(cvmm(x_nd, sel_nk, w1_edg, impl="pallas"))
    y_nd = cvmm(h_nkg, sel_nk, w2_egd, gates_nk, impl="pallas")
  else:
    y_nd = expert_mlp(x_nd, sel_nk, gates_nk, w1_edg, w2_egd, impl="pallas")
  return jnp.sum(y_nd.astype(jnp.float32))


def _compile(target_name: str, op: str):
  target = targets.parse_target(target_name)
  mesh = targets.one_device_mesh(target)
  sharding = NamedSharding(mesh, P())
  shapes = [((N, D), jnp.bfloat16), ((N, K), jnp.int32), ((N, K), jnp.bfloat16),
            ((E, D, G), jnp.bfloat16), ((E, G, D), jnp.bfloat16)]
  args = [jax.ShapeDtypeStruct(s, t, sharding=sharding) for s, t in shapes]
  grads = jax.jit(jax.grad(lambda *a: _loss(*a, op=op), argnums=(0, 2, 3, 4)))
  with jax.set_mesh(mesh):
    return grads.trace(*args).lower(lowering_platforms=(target.lowering_platform,)).compile()


def _slot_row_copies(hlo: str) -> list[str]:
  """Gathers producing bf16 rows of d_model for every slot from an [N, d_model] source:
  copies of x or of dy (not the kernels' [N k, d_model] outputs gathered back to tokens)."""
  shapes = dict(re.findall(r"%([\w.\-]+) = (\w+\[[\d,]*\])", hlo))
  pattern = rf"= bf16\[{N * K},(1,)?{D}\]\{{[^}}]*\}} gather\(%([\w.\-]+)"
  return [line for line in hlo.splitlines()
          if (match := re.search(pattern, line)) and shapes.get(match[2]) == f"bf16[{N},{D}]"]


@needs_gpu
@pytest.mark.parametrize("op", ["cvmm", "expert_mlp"])
@pytest.mark.parametrize("target_name", ["h100", "a100"])
def test_the_gathering_kernels_compile_without_copies_of_token_rows(target_name, op,
                                                                    monkeypatch):
  compiled = _compile(target_name, op)
  hlo = compiled.as_text()
  assert "cvmm_segment_matmul" in hlo and "cvmm_weight_grad" in hlo
  assert not _slot_row_copies(hlo)
  temp = memory.MemoryUse.of(compiled).temporary

  triton = backends._BACKENDS["pallas_triton"]
  monkeypatch.setitem(backends._BACKENDS, "pallas_triton",
                      dataclasses.replace(triton, gathers_rows=False))
  copying = _compile(target_name, op)
  assert len(_slot_row_copies(copying.as_text())) >= 2  # x (fwd and bwd), dy: the search works.
  one_copy = N * K * D * jnp.dtype(jnp.bfloat16).itemsize
  assert temp + one_copy <= memory.MemoryUse.of(copying).temporary


@needs_gpu
def test_the_moe_layer_keeps_no_float32_rows_of_d_model():
  """expert_mlp's down projection and input gradient write their [N k, d_model] rows in the
  compute dtype (summed over the k slots in float32 afterwards): no float32 tensor of that
  size is in the bf16 program, where it held two (the O(T k d) temporaries of issue 59)."""
  hlo = _compile("h100", "expert_mlp").as_text()
  assert not re.findall(rf"f32\[{N * K},(?:1,)?{D}\]", hlo)
  assert re.findall(rf"bf16\[{N * K},(?:1,)?{D}\]", hlo)  # those rows, in bf16
