"""Our kernels and a training config compiled for an H100, an A100 and a TPU v5e, on CPU.

Needs the compile extra (`pip install -e ".[compile]"`: the CUDA plugin with ptxas, and
libtpu); without it every test here is skipped with the reason. Each compile is real: XLA's
GPU compiler with Triton and ptxas, or libtpu's compiler, for the target's devices.
"""

import importlib.util
import re

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

from pallas_kernels import cvmm, expert_mlp
from sparse_jax.aot import kernel_resources, memory, targets
from sparse_jax.tasks import task_for
from sparse_jax.training import compile_only
import tiny_moe_config
from aot_testing import needs_gpu, needs_tpu
from cli_testing import run_script


N, D, G, K, E = 2048, 256, 128, 4, 32  # tokens, d_model, expert size, k, experts
# What each target's kernels are called in the compiled program.
_KERNELS = {"pallas": ("cvmm_segment_matmul", "cvmm_weight_grad"),
            "mosaic": ("mosaic_gpu",), "megablox": ("gmm", "tgmm")}


def _moe_grads(x_nd, sel_nk, gates_nk, w1_edg, w2_egd, *, op, impl):
  def loss(x_nd, gates_nk, w1_edg, w2_egd):
    if op == "cvmm":
      h_nkg = jax.nn.relu(cvmm(x_nd, sel_nk, w1_edg, impl=impl))
      y_nd = cvmm(h_nkg, sel_nk, w2_egd, gates_nk, impl=impl)
    else:
      y_nd = expert_mlp(x_nd, sel_nk, gates_nk, w1_edg, w2_egd, impl=impl)
    return jnp.sum(y_nd.astype(jnp.float32))
  return jax.grad(loss, argnums=(0, 1, 2, 3))(x_nd, gates_nk, w1_edg, w2_egd)


def _compile_moe(target_name, op, impl, dtype, options=None, d_model=D):
  target = targets.parse_target(target_name)
  mesh = targets.one_device_mesh(target)
  sharding = NamedSharding(mesh, P())
  shapes = [((N, d_model), dtype), ((N, K), jnp.int32), ((N, K), dtype),
            ((E, d_model, G), dtype), ((E, G, d_model), dtype)]
  args = [jax.ShapeDtypeStruct(s, t, sharding=sharding) for s, t in shapes]
  fn = jax.jit(lambda *a: _moe_grads(*a, op=op, impl=impl))
  with jax.set_mesh(mesh):
    return fn.trace(*args).lower(lowering_platforms=(target.lowering_platform,)).compile(
        options)


def _temp_bound(dtype) -> int:
  """Temporaries of a grouped MoE backward: a few copies of the slot rows ([N k, D] and
  [N k, G] in float32, sorted, gathered, their gradients) and of the weights' float32
  gradients. A dense fallback (every token times every expert, as `ragged` is on GPUs)
  needs about E times the slot rows and exceeds it."""
  del dtype
  slot_rows = N * K * (D + G) * 4
  weights = 2 * E * D * G * 4
  return 8 * (slot_rows + weights)


targets_and_impls = [
    pytest.param("h100", "pallas", marks=needs_gpu), pytest.param("h100", "mosaic",
                                                                   marks=needs_gpu),
    pytest.param("a100", "pallas", marks=needs_gpu), pytest.param("v5e", "megablox",
                                                                   marks=needs_tpu)]


@pytest.mark.parametrize("op", ["cvmm", "expert_mlp"])
@pytest.mark.parametrize("target_name,impl", targets_and_impls)
def test_kernels_compile_with_our_kernel_inside_and_bounded_memory(target_name, impl, op):
  dtypes = [jnp.bfloat16] if impl == "mosaic" else [jnp.bfloat16, jnp.float32]
  for dtype in dtypes:
    compiled = _compile_moe(target_name, op, impl, dtype)
    hlo = compiled.as_text()
    for kernel in _KERNELS[impl]:
      assert kernel in hlo, f"{kernel} missing for {target_name}/{impl}: a silent fallback"
    assert not re.search(r"ragged-dot|ragged_dot", hlo)
    temp = memory.MemoryUse.of(compiled).temporary
    assert temp < _temp_bound(dtype), (target_name, impl, jnp.dtype(dtype).name, temp)


@needs_gpu
def test_the_memory_bound_catches_a_dense_fallback():
  """The bound above is not vacuous: XLA's ragged_dot on a GPU (a masked dense dot) breaks
  it at the same shapes."""
  compiled = _compile_moe("h100", "expert_mlp", "ragged", jnp.bfloat16)
  assert memory.MemoryUse.of(compiled).temporary > _temp_bound(jnp.bfloat16)


@needs_gpu
@pytest.mark.parametrize("target_name", ["h100", "a100"])
def test_triton_kernels_do_not_spill(target_name, tmp_path):
  target = targets.parse_target(target_name)
  for dtype in (jnp.bfloat16, jnp.float32):
    dump = tmp_path / jnp.dtype(dtype).name
    _compile_moe(target_name, "expert_mlp", "pallas", dtype,
                 kernel_resources.dump_options(str(dump)))
    found = kernel_resources.kernel_resources(str(dump), target)
    assert {k.name for k in found} >= {"cvmm_segment_matmul", "cvmm_weight_grad"}, found
    for kernel in found:
      assert not kernel.spills, kernel
      assert 0 < kernel.registers <= 255 and kernel.occupancy > 0, kernel
      assert kernel.shared_bytes <= target.spec["shared_memory_per_block_optin"], kernel


@needs_gpu
def test_mosaic_kernels_do_not_spill(tmp_path):
  """...and are Hopper kernels: compiled for sm_90a, their matmuls wgmma and their loads TMA
  (issue 59). The plugin compiles each Mosaic kernel once per process: a d_model no other
  test uses makes sure these are compiled (and dumped) here."""
  target = targets.parse_target("h100")
  with kernel_resources.mosaic_dump(str(tmp_path)):
    _compile_moe("h100", "expert_mlp", "mosaic", jnp.bfloat16, d_model=384)
  found = kernel_resources.mosaic_kernel_resources(str(tmp_path), target)
  assert len(found) >= 3, found  # Forward, input gradient, weight gradient at least.
  for kernel in found:
    assert not kernel.spills, kernel
    assert 0 < kernel.registers <= 255 and kernel.threads % 128 == 0, kernel
    assert 0 < kernel.shared_bytes <= target.spec["shared_memory_per_block_optin"], kernel
    assert kernel.occupancy > 0, kernel
    assert kernel.ptx["target"] == "sm_90a", kernel
    assert kernel.ptx["wgmma"] > 0 and kernel.ptx["tma"] > 0, kernel


def test_ptx_instructions_counts_where_instructions_start():
  """Mosaic's PTX forms: plain, predicated, and inside inline-assembly braces; not comments or
  other instructions that contain the words."""
  ptx = "\n".join([
      ".version 8.0", ".target sm_90a",
      "\twgmma.fence.sync.aligned;",
      "\t{ .reg .pred p; setp.ne.b32 p, 1, 0; wgmma.mma_async.sync.aligned.m64n128k16 {%r1}; }",
      "\twgmma.mma_async.sync.aligned.m64n64k16 {%r2};",
      "\t@%p24 cp.async.bulk.tensor.4d.shared::cluster.global [%r3], [%rd1];",
      "\t@!%p2 cp.async.bulk.tensor.2d.global.shared::cta [%rd2], [%r4];",
      "\t// wgmma.mma_async in a comment", "\tmma.sync.aligned.m16n8k16.row.col {%r5};"])
  assert kernel_resources.ptx_instructions(ptx) == {"target": "sm_90a", "wgmma": 2, "tma": 2,
                                                    "mma_sync": 1}


def test_global_load_bytes_reads_each_entrys_loads():
  """Triton's PTX forms: scalar and vector `ld.global` (predicated, after `mov`s on one line)
  and 16- and 4-byte `cp.async`; stores, shared loads and `cp.async` bookkeeping are not
  loads. Each `.entry` of a module is counted apart."""
  ptx = "\n".join([
      ".visible .entry first(", "\tmov.u16 %rs1, %rs2; @%p8 ld.global.b16 { %rs1 }, [ %rd3 + 0 ];",
      "\tmov.u32 %r1, 0x0; ld.global.b32 { %r1 }, [ %rd1 + 0 ];",
      "\tst.global.b16 [ %rd2 + 0 ], { %rs1 };", "\tld.shared.v4.b32 {%r1, %r2, %r3, %r4}, [%r5];",
      ".visible .entry second(",
      "\tmov.u32 %r3, %r9; @%p1 ld.global.v4.b32 { %r3, %r4, %r5, %r6 }, [ %rd16 + 0 ];",
      "\tcp.async.cg.shared.global [ %r41 + 0 ], [ %rd18 + 0 ], 0x10, %r43;",
      "\tcp.async.ca.shared.global [ %r42 + 0 ], [ %rd19 + 0 ], 0x4, %r43;",
      "\tcp.async.commit_group;", "\tcp.async.wait_group 0;"])
  entries = kernel_resources.entry_ptx(ptx)
  assert list(entries) == ["first", "second"]
  assert kernel_resources.global_load_bytes(entries["first"]) == {2: 1, 4: 1}
  assert kernel_resources.global_load_bytes(entries["second"]) == {4: 1, 16: 2}


def test_occupancy_follows_the_calculators_rule():
  """Hand-worked cases on an H100 SM (64 K registers, 228 KiB, 2048 threads)."""
  h100 = targets.parse_target("h100").spec
  # 128 threads x 128 registers = 16 K registers per block: 4 blocks, 512 of 2048 threads.
  assert kernel_resources.occupancy(h100, 128, 128, 0) == 0.25
  # 72 KiB of shared memory per block: 3 blocks fit in 228 KiB.
  assert kernel_resources.occupancy(h100, 128, 32, 73728) == 3 * 128 / 2048
  # 33 registers round up to 40 per thread (256 per warp): 6 blocks of 256 threads.
  assert kernel_resources.occupancy(h100, 256, 33, 0) == 6 * 256 / 2048


@pytest.mark.parametrize("target_name,expert", [
    pytest.param("h100", 1, marks=needs_gpu), pytest.param("a100", 1, marks=needs_gpu),
    pytest.param("v5e", 1, marks=needs_tpu), pytest.param("v5e:2x2", 1, marks=needs_tpu),
    pytest.param("h100:2", 1, marks=needs_gpu), pytest.param("v5e:2x2", 4, marks=needs_tpu),
    pytest.param("h100:4", 4, marks=needs_gpu)])
def test_compile_task_reports_the_executables_memory(target_name, expert):
  """One device, data parallelism (the MoE kernels mapped over each device's tokens) and
  expert parallelism (the kernels inside the exchange's shard_map)."""
  target = targets.parse_target(target_name)
  config = tiny_moe_config.get_config()
  config.mesh.update(data=-1, expert=expert)
  compiled = compile_only.compile_task(task_for(config), target)
  assert compiled.mesh_shape["data"] * compiled.mesh_shape["expert"] == target.n_devices
  stats = compiled.train.memory_analysis()
  assert compiled.train_use.total == (
      stats.argument_size_in_bytes + stats.output_size_in_bytes - stats.alias_size_in_bytes
      + stats.temp_size_in_bytes + stats.generated_code_size_in_bytes)
  assert compiled.fits and compiled.peak >= compiled.train_use.total
  hlo = compiled.train.as_text()
  kernels = _KERNELS["megablox" if target.platform == "tpu" else "pallas"]
  assert all(kernel in hlo for kernel in kernels), "the MoE layer left our kernels"


@needs_gpu
def test_train_py_compile_only_prints_the_memory():
  result = run_script("train.py", "--config=tests/aot/tiny_moe_config.py", "--compile_only=h100",
                      "--config.model.dtype=bfloat16")
  assert result.returncode == 0, result.stderr[-3000:]
  assert "training step:" in result.stdout and "evaluation step:" in result.stdout
  assert re.search(r"peak [\d.]+ GiB of the device's 79\.11 GiB: fits", result.stdout)
  assert "operands of the training step, by FLOPs: bf16 x bf16 100.0%" in result.stdout


@needs_tpu
def test_train_py_compile_only_says_a_step_does_not_fit_a_tpu():
  """libtpu refuses, at compile time, a program larger than the chip: the tiny model with
  16384 x 1024 tokens needs float32 logits of 16384 x 1024 x 256 x 4 B = 16 GiB alone."""
  result = run_script("train.py", "--config=tests/aot/tiny_moe_config.py", "--compile_only=v5e",
                      "--config.data.batch_size=16384", "--config.data.seq_len=1024")
  assert result.returncode != 0
  assert "does not fit on v5e" in result.stderr and "RESOURCE_EXHAUSTED" in result.stderr
  assert "Lower the batch size" in result.stderr


def test_train_py_compile_only_refuses_an_unknown_target():
  result = run_script("train.py", "--config=tests/aot/tiny_moe_config.py", "--compile_only=h300")
  assert result.returncode != 0
  assert "unknown target 'h300'; known: h100, h200, a100, v5e, v5p, v6e" in result.stderr


def test_a_missing_compiler_names_the_extra(monkeypatch):
  monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
  with pytest.raises(targets.TargetError, match=r'pip install -e "\.\[compile\]"'):
    targets.require_compiler(targets.parse_target("v5e"))


@pytest.mark.parametrize("text,shape,n", [("h100", "1x1x1", 1), ("h100:8", "1x1x8", 8),
                                          ("H200:2x4", "1x2x4", 8), ("v5e", "1x1", 1),
                                          ("v5e:2x2", "2x2", 4), ("v5p:2x2x1", "2x2x1", 4)])
def test_target_names(text, shape, n):
  target = targets.parse_target(text)
  assert (target.shape, target.n_devices) == (shape, n)


def test_bad_target_shapes_say_how_to_write_them():
  with pytest.raises(targets.TargetError, match="NAME:N"):
    targets.parse_target("a100:two")
  with pytest.raises(targets.TargetError, match="2x2"):
    targets.parse_target("v6e:4")
