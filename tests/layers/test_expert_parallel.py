"""Expert parallelism: every MoE kind on (data, fsdp, expert) meshes equals one device; with
`tensor` too, each expert's columns split, for the XLA impls and for the GPU and TPU kernels
(Triton, megablox: in interpret mode, taken as unpartitionable so that the unchecked maps run)
in the FF's experts and SwitchHead's.

The meshed layer runs as `with jax.set_mesh(mesh): jax.jit(f)(...)` on the 8 CPU devices of
conftest.py, with parameters and the batch placed as training places them
(`parallel.state_shardings`, `parallel.batch_sharding`). On CPU the layers take the padded
exchange ("auto"); the ragged one is checked on `apply_experts` directly: numerically on CPU
through an emulated lowering of `ragged_all_to_all` (XLA:CPU has none; JAX's own JVP and
transpose rules still run), and as lowered for an H100 mesh.
"""

import functools
import re

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from flax import nnx
from jax.extend.core.primitives import ragged_all_to_all_p
from jax.interpreters import mlir
from jax.sharding import AbstractDevice, AbstractMesh, AxisType
from jax.sharding import PartitionSpec as P

from sparse_jax import parallel
from sparse_jax.aot.collectives import collectives
from sparse_jax.layers import build_ff, expert_parallel
from sparse_jax.layers.switchhead_attention import SwitchHeadAttention, SwitchHeadXLAttention
from sparse_jax.models.rngs import make_rngs

D, E, G = 16, 8, 4
X_SHAPE = (8, 4, D)  # 32 tokens: 4 per device on 8 devices.
MESHES = [(1, 1, 8), (2, 2, 2), (2, 1, 4)]
# Every kind runs on the mixed mesh; the kinds with distinct batch statistics (sigma-MoE's
# entropy, Switch's capacity) on all three. Compilation dominates this file's time.
KIND_MESHES = {"sigma_moe": MESHES, "switch": MESHES}

KINDS = {
    "sigma_moe": dict(k=2, reg_coef=0.01, expert_dropout=0.2),
    "switch": dict(capacity_factor=1.0, reg_coef=0.01),
    "noisy_topk": dict(k=2, reg_coef=0.01),
    "sbase": dict(k=2, reg_coef=0.01),
    "softmax_moe_renorm": dict(k=2, renorm=True, reg_coef=0.01),
    "softmax_moe": dict(k=2, renorm=False, reg_coef=0.01),
}


def make_layer(name, seed=0, **overrides):
  fields = dict(KINDS[name], **overrides)
  kind = "softmax_moe" if name.startswith("softmax_moe") else name
  cfg = ml_collections.ConfigDict(dict(kind=kind, n_experts=fields.pop("n_experts", E),
                                       expert_size=G, impl=fields.pop("impl", "blocked"), **fields))
  return build_ff(cfg, d_model=D, n_layers=2, rngs=nnx.Rngs(seed))


@functools.partial(jax.jit, static_argnums=0)
def forward_and_grads(graphdef, params, rest, x, cotangent):
  """`y`, `aux` and the gradients w.r.t. params and x of `sum(y * cotangent) + reg_loss`."""

  def loss(model, x):
    y, aux = model(x)
    return jnp.sum(y * cotangent) + aux["reg_loss"], (y, aux)

  model = nnx.merge(graphdef, params, rest)
  (_, (y, aux)), grads = nnx.value_and_grad(loss, argnums=(0, 1), has_aux=True)(model, x)
  return y, aux, (nnx.to_pure_dict(grads[0]), grads[1])


def inputs(seed, shape=X_SHAPE):
  kx, kc = jax.random.split(jax.random.key(seed))
  return jax.random.normal(kx, shape), jax.random.normal(kc, shape)


def run(layer, x, cotangent, mesh_shape=None, place=True):
  """The layer's outputs and gradients, on one device or on a `(data, fsdp, expert)` mesh
  (with `place`, the parameters and the batch are first put where training puts them)."""
  graphdef, params, rest = nnx.split(layer, nnx.Param, ...)
  if mesh_shape is None:
    return jax.device_get(forward_and_grads(graphdef, params, rest, x, cotangent))
  mesh = parallel.make_mesh(mesh_shape)
  if place:
    params = jax.device_put(params, parallel.state_shardings(params, mesh))
    x, cotangent = jax.device_put((x, cotangent), parallel.batch_sharding(mesh, x.ndim))
  with jax.set_mesh(mesh):
    return jax.device_get(forward_and_grads(graphdef, params, rest, x, cotangent))


def assert_tree_close(got, want):
  # Float32, different summation order only (per-device partial sums of the router's batch
  # statistics and of the weight gradients, the k slots summed after the exchange): a few ulps
  # of the largest magnitude in each array, hence atol scaled by that magnitude.
  def close(path, g, w):
    w = np.asarray(w)
    atol = 1e-6 * max(float(np.abs(w).max(initial=0.0)), 1e-3)
    np.testing.assert_allclose(np.asarray(g), w, rtol=1e-5, atol=atol,
                               err_msg=jax.tree_util.keystr(path))

  jax.tree.map_with_path(close, got, want)


@pytest.mark.parametrize("name", sorted(KINDS))
def test_every_kind_on_a_mesh_equals_one_device(name):
  layer = make_layer(name)
  if name == "noisy_topk":  # Non-zero noise net, so its gradient path is exercised too.
    layer.router.w_noise[...] = 0.3 * jax.random.normal(jax.random.key(7), (E, D))
  # Training mode: the routers' randomness (expert dropout, routing noise) is drawn from the
  # same keys whatever the sharding, so it is identical on one device and on a mesh.
  x, cotangent = inputs(1)
  want = run(layer, x, cotangent)
  assert np.abs(want[2][0]["w_up"]).max() > 0
  for mesh_shape in KIND_MESHES.get(name, [(2, 2, 2)]):
    assert_tree_close(run(layer, x, cotangent, mesh_shape), want)


# (data, fsdp, expert, tensor): tensor alone, with data, with fsdp and expert, with expert.
TENSOR_MESHES = [(1, 1, 1, 4), (2, 1, 1, 4), (1, 2, 2, 2), (1, 1, 4, 2)]


@pytest.mark.parametrize("name", sorted(KINDS))
def test_every_kind_with_tensor_parallel_experts_equals_one_device(name):
  """Each expert's G columns split over `tensor` (G = 4: one column per device on tensor 4,
  their partial outputs summed by one psum), the router replicated: outputs, the routers'
  statistics and every gradient equal one device's. The sigma-MoE on every mesh, the other
  kinds on the data x tensor one."""
  layer = make_layer(name)
  x, cotangent = inputs(3)
  want = run(layer, x, cotangent)
  meshes = TENSOR_MESHES if name == "sigma_moe" else TENSOR_MESHES[1:2]
  for mesh_shape in meshes:
    assert_tree_close(run(layer, x, cotangent, mesh_shape), want)


def test_tensor_parallel_experts_keep_their_columns_split():
  """On data 2 x tensor 4 the expert weights stay split over `tensor` (one all-reduce of the
  partial outputs, none of them all-gathered)."""
  layer = make_layer("sigma_moe")
  x, cotangent = inputs(3)
  graphdef, params, rest = nnx.split(layer, nnx.Param, ...)
  mesh = parallel.make_mesh(TENSOR_MESHES[1])
  params = jax.device_put(params, parallel.state_shardings(params, mesh))
  assert params["w_up"].get_value().sharding.spec == P("expert", "fsdp", "tensor")
  assert params["w_down"].get_value().sharding.spec == P("expert", "tensor", "fsdp")
  with jax.set_mesh(mesh):
    hlo = forward_and_grads.lower(graphdef, params, rest, x, cotangent).compile().as_text()
  over_tensor = [c for c in collectives(hlo) if c.group_size == 4]
  assert {c.kind for c in over_tensor} == {"all-reduce"}
  # The outputs' partial sums forward, the input gradient's backward, on the 16 token rows.
  assert [c.shape for c in over_tensor if not c.backward] == [(16, D)]
  assert (16, D) in [c.shape for c in over_tensor if c.backward]


@pytest.fixture
def unpartitionable_kernels(monkeypatch):
  """Every impl taken for a GPU or TPU kernel (`pallas_kernels.partitionable` False), as on
  such a device, so that the maps run their unchecked path (`check_vma=False`) on CPU, where
  "pallas" and "megablox" run those kernels in Pallas interpret mode. Traces again with the
  patched rule, and after it."""
  monkeypatch.setattr(expert_parallel.pallas_kernels, "partitionable", lambda impl: False)
  jax.clear_caches()
  yield
  jax.clear_caches()


def unchecked_maps(layer, x, cotangent, mesh_shape) -> list[bool]:
  """The `check_vma` of every `shard_map` in the jaxpr of the layer's forward and backward
  pass on a mesh of `mesh_shape`."""
  graphdef, params, rest = nnx.split(layer, nnx.Param, ...)
  with jax.set_mesh(parallel.make_mesh(mesh_shape)):
    jaxpr = jax.make_jaxpr(forward_and_grads, static_argnums=0)(graphdef, params, rest, x,
                                                                cotangent)
  return re.findall(r"check_vma=(\w+)", str(jaxpr))


@pytest.mark.usefixtures("unpartitionable_kernels")
@pytest.mark.parametrize("impl", ["pallas", "megablox"])
def test_gpu_and_tpu_kernels_on_tensor_parallel_experts_equal_one_device(impl):
  """The Triton (`pallas`) and megablox kernels, in interpret mode, each device on its `G / t`
  slice of every selected expert inside the unchecked map, on tensor 4 (Triton), data x
  tensor and expert x tensor: outputs and every gradient equal one device's gather oracle.
  Unchecked, shard_map's transpose sums the rows' gradients over `tensor` and the weights'
  over the batch axes itself, where the checked map has `pcast` marks do it."""
  layer = make_layer("sigma_moe", impl=impl)
  x, cotangent = inputs(3)
  want = run(make_layer("sigma_moe", impl="gather"), x, cotangent)
  meshes = TENSOR_MESHES[1::2] if impl == "megablox" else TENSOR_MESHES[:2] + TENSOR_MESHES[3:]
  for mesh_shape in meshes:
    assert set(unchecked_maps(layer, x, cotangent, mesh_shape)) == {"False"}
    assert_tree_close(run(layer, x, cotangent, mesh_shape), want)


def test_uneven_routing_with_idle_experts():
  """Every token picks experts 0 and 1 (one device of the (2, 1, 4) mesh); 2..7 get nothing."""
  layer = make_layer("sigma_moe", expert_dropout=0.0)
  direction = jnp.zeros((D,)).at[0].set(1.0)
  w_sel = layer.router.w_sel[...]
  layer.router.w_sel[...] = w_sel.at[0].add(8 * direction).at[1].add(6 * direction)
  x, cotangent = inputs(2)
  x = x.at[..., 0].set(jnp.abs(x[..., 0]) + 2.0)
  want = run(layer, x, cotangent)
  usage = want[1]["expert_usage"]
  assert usage[0] == usage[1] == X_SHAPE[0] * X_SHAPE[1] and usage[2:].sum() == 0
  # On (2, 1, 4) each device sends all of its slots to expert-device 0, filling that send
  # buffer to its capacity C = N_l * k; the other three expert-devices receive only padding.
  assert_tree_close(run(layer, x, cotangent, (2, 1, 4)), want)
  graphdef, params, rest = nnx.split(layer, nnx.Param, ...)
  with jax.set_mesh(parallel.make_mesh((2, 1, 4))):
    hlo = forward_and_grads.lower(graphdef, params, rest, x, cotangent).as_text()
  assert "all_to_all" in hlo  # The slots really travelled; no silent fallback to one device.


def test_hidden_dropout_in_training_runs_on_a_mesh_and_is_off_in_eval():
  """Hidden-dropout masks are drawn per device (the key folds in the device's position), so
  they differ from the single-device mask: only finiteness is checked in training."""
  layer = make_layer("switch", expert_hidden_dropout=0.5)
  x, cotangent = inputs(3)
  y_train, _, grads = run(layer, x, cotangent, (2, 1, 4))
  assert all(np.all(np.isfinite(g)) for g in jax.tree.leaves(grads))
  layer.eval()  # The switch router has no training-only behaviour: only the dropout stops.
  want = run(make_layer("switch"), x, cotangent)
  assert_tree_close(run(layer, x, cotangent, (2, 1, 4)), want)
  assert np.abs(y_train - want[0]).max() > 0.1 * np.abs(want[0]).max()


def test_hidden_dropout_follows_the_reseeded_dropout_stream():
  """The training step reseeds `dropout` each step: same key, same mask; new key, new mask."""
  layer = build_ff(ml_collections.ConfigDict(dict(
      kind="softmax_moe", n_experts=E, expert_size=G, k=2, renorm=True, reg_coef=0.0,
      impl="blocked", expert_hidden_dropout=0.5)), d_model=D, n_layers=2, rngs=make_rngs(0))
  x, cotangent = inputs(5)

  def y_after_reseed(seed):
    nnx.reseed(layer, dropout=seed)
    return run(layer, x, cotangent)[0]

  np.testing.assert_array_equal(y_after_reseed(1), y_after_reseed(1))
  assert np.abs(y_after_reseed(1) - y_after_reseed(2)).max() > 0


def test_indivisible_experts_or_tokens_raise():
  layer = make_layer("softmax_moe", n_experts=6)
  x, cotangent = inputs(4)
  # Unplaced: `jax.device_put` would already refuse to split 6 experts (or 3 sequences) 4 ways.
  with pytest.raises(ValueError, match=r"model\.ff\.n_experts=6.*mesh\.expert=4"):
    run(layer, x, cotangent, (2, 1, 4), place=False)
  x, cotangent = inputs(4, (3, 4, D))
  with pytest.raises(ValueError, match="12 tokens"):
    run(make_layer("softmax_moe"), x, cotangent, (2, 1, 4), place=False)


def _emulated_ragged_all_to_all(operand, output, input_offsets, send_sizes, output_offsets,
                                recv_sizes, *, axis_name, axis_index_groups):
  """`ragged_all_to_all` as its docstring defines it, from `all_gather`s: each device gathers
  every operand and writes the pieces addressed to it. NaN (or -1) everywhere if the sizes
  disagree with `recv_sizes` or a piece would end past the output: mistakes of the caller
  that real backends would not report."""
  assert axis_index_groups is None
  me = jax.lax.axis_index(axis_name)
  operand_p = jax.lax.all_gather(operand, axis_name)
  start_p, size_p, dest_p = (jax.lax.all_gather(a, axis_name)[:, me]
                             for a in (input_offsets, send_sizes, output_offsets))
  rows_r = jnp.arange(output.shape[0])
  result = output
  for p in range(operand_p.shape[0]):
    offset_r = rows_r - dest_p[p]
    hit_r = (offset_r >= 0) & (offset_r < size_p[p])
    piece = jnp.take(operand_p[p], jnp.clip(start_p[p] + offset_r, 0, operand.shape[0] - 1),
                     axis=0)
    result = jnp.where(hit_r.reshape(-1, *[1] * (output.ndim - 1)), piece, result)
  ok = jnp.all(size_p == recv_sizes) & jnp.all(dest_p + size_p <= output.shape[0])
  bad = jnp.nan if jnp.issubdtype(output.dtype, jnp.floating) else -1
  return jnp.where(ok, result, jnp.asarray(bad, output.dtype))


@pytest.fixture(scope="module")
def ragged_on_cpu():
  """Makes `ragged_all_to_all` run on CPU: the real one if this jaxlib's XLA:CPU has it, else
  the emulation (registered for the process; nothing else on CPU could run it anyway)."""
  mesh = jax.make_mesh((2,), ("x",), axis_types=(AxisType.Auto,))
  one_p = jnp.ones((2,), jnp.int32)

  def swap(x):  # Row p of each device goes to device p.
    return jax.lax.ragged_all_to_all(x, jnp.zeros_like(x), jnp.arange(2, dtype=jnp.int32),
                                     one_p, jax.lax.axis_index("x") * one_p, one_p,
                                     axis_name="x")

  try:
    jax.jit(jax.shard_map(swap, mesh=mesh, in_specs=P("x"), out_specs=P("x")))(jnp.ones(4))
  except jax.errors.JaxRuntimeError as e:
    assert "ragged-all-to-all" in str(e), e
    mlir.register_lowering(ragged_all_to_all_p, mlir.lower_fun(
        _emulated_ragged_all_to_all, multiple_results=False), platform="cpu")


N_TOKENS, K = 32, 2


@functools.partial(jax.jit, static_argnames=("exchange", "recv_factor"))
def experts_and_grads(x, sel, gates, w_up, w_down, cotangent, exchange="auto",
                      recv_factor=None):
  """`apply_experts` and the gradients of `sum(y * cotangent)` w.r.t. x, gates, w_up, w_down."""

  def loss(x, gates, w_up, w_down):
    y = expert_parallel.apply_experts(x, sel, gates, w_up, w_down, impl="blocked",
                                      exchange=exchange, recv_factor=recv_factor)
    return jnp.sum(y * cotangent), y

  (_, y), grads = jax.value_and_grad(loss, argnums=(0, 1, 2, 3), has_aux=True)(
      x, gates, w_up, w_down)
  return y, grads


def expert_inputs(sel):
  keys = jax.random.split(jax.random.key(11), 5)
  return (jax.random.normal(keys[0], (N_TOKENS, D)), sel,
          jax.random.uniform(keys[1], (N_TOKENS, K), minval=0.1),
          jax.random.normal(keys[2], (E, D, G)), jax.random.normal(keys[3], (E, G, D)),
          jax.random.normal(keys[4], (N_TOKENS, D)))


def routing(name):
  """`sel [N_TOKENS, K]`: distinct experts per token, drawn from a skewed distribution that
  leaves experts 4, 5 and 7 empty, or all tokens on experts 0 and 1."""
  if name == "all_on_0_and_1":
    return jnp.tile(jnp.array([0, 1], jnp.int32), (N_TOKENS, 1))
  rng = np.random.default_rng(0)
  probs = np.array([8, 4, 2, 1, 0, 0, 1, 0]) / 16
  return jnp.asarray(np.stack([rng.choice(E, K, replace=False, p=probs)
                               for _ in range(N_TOKENS)]), jnp.int32)


def on_mesh(mesh_shape, *args, **kwargs):
  with jax.set_mesh(parallel.make_mesh(mesh_shape)):
    return jax.device_get(experts_and_grads(*args, **kwargs))


@pytest.mark.usefixtures("ragged_on_cpu")
def test_ragged_and_padded_exchanges_equal_one_device():
  """Skewed routing with idle experts (and devices receiving nothing), and every slot on
  experts 0 and 1: on (2, 1, 4) expert-device 0 then receives exactly its worst-case
  buffer, `n_ep * C` rows."""
  for name in ("skewed", "all_on_0_and_1"):
    args = expert_inputs(routing(name))
    want = jax.device_get(experts_and_grads(*args))
    assert np.abs(want[1][2]).max() > 0
    for mesh_shape in [(1, 1, 8), (2, 1, 4)]:
      for exchange in ("ragged", "padded"):
        assert_tree_close(on_mesh(mesh_shape, *args, exchange=exchange), want)


@pytest.mark.usefixtures("ragged_on_cpu")
def test_ragged_receive_capacity_is_exact_or_nan():
  """With `recv_factor=2` each device of (2, 1, 4) receives at most 2 * C = 16 rows. Uniform
  routing fits and is exact. With the skewed routing in the second expert group (its
  expert-device 0 needs 23 rows) that group returns NaN for all of its tokens, never a
  silently dropped slot, while the first group stays exact."""
  uniform = jnp.stack([jnp.arange(N_TOKENS) % E, (jnp.arange(N_TOKENS) + 3) % E], axis=1)
  args = expert_inputs(uniform.astype(jnp.int32))
  want = jax.device_get(experts_and_grads(*args))
  assert_tree_close(on_mesh((2, 1, 4), *args, exchange="ragged", recv_factor=2.0), want)
  half = N_TOKENS // 2
  mixed = jnp.concatenate([uniform[:half], routing("skewed")[half:]]).astype(jnp.int32)
  y, _ = on_mesh((2, 1, 4), *expert_inputs(mixed), exchange="ragged", recv_factor=2.0)
  assert_tree_close(y[:half], want[0][:half])
  assert np.isnan(y[half:]).all()
  with pytest.raises(ValueError, match="recv_factor must be positive"):
    on_mesh((2, 1, 4), *args, exchange="ragged", recv_factor=0.0)


_H100 = AbstractDevice(device_kind="NVIDIA H100 80GB HBM3", num_cores=132, platform="gpu")
_TPU = AbstractDevice(device_kind="TPU v5 lite", num_cores=1, platform="tpu")


def test_auto_exchange_is_ragged_on_tpu_only_and_ragged_lowers_for_gpus():
  cpu_mesh = parallel.make_mesh((2, 1, 4))
  gpu_mesh, tpu_mesh = (AbstractMesh((2, 1, 4, 1), parallel.MESH_AXES,
                                     axis_types=(AxisType.Auto,) * 4, abstract_device=device)
                        for device in (_H100, _TPU))
  assert expert_parallel.resolve_exchange("auto", cpu_mesh.abstract_mesh) == "padded"
  assert expert_parallel.resolve_exchange("ragged", cpu_mesh.abstract_mesh) == "ragged"
  assert expert_parallel.resolve_exchange("auto", gpu_mesh) == "padded"
  assert expert_parallel.resolve_exchange("auto", tpu_mesh) == "ragged"
  with pytest.raises(ValueError, match="exchange must be one of"):
    expert_parallel.resolve_exchange("dense", gpu_mesh)
  # Lowered for the H100 mesh, the ragged exchange moves slots by ragged_all_to_all: forward x,
  # expert ids and gates there and results back; backward the output cotangents there, the
  # x and gate cotangents back. The only all_to_alls left exchange [n_ep] offsets (JAX's
  # transpose rule); none carries a worst-case buffer.
  shapes = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in expert_inputs(routing("skewed"))]
  with jax.sharding.use_abstract_mesh(gpu_mesh):
    hlo = experts_and_grads.trace(*shapes, exchange="ragged").lower(
        lowering_platforms=("cuda",)).as_text()
  assert hlo.count("custom_call @ragged_all_to_all") == 7
  assert set(re.findall(r'"stablehlo\.all_to_all"\(.*: \((tensor<[^>]*>)\)', hlo)) == {
      "tensor<4xi32>"}
  with jax.set_mesh(cpu_mesh):
    hlo = experts_and_grads.lower(*expert_inputs(routing("skewed"))).as_text()
  assert "all_to_all" in hlo and "ragged_all_to_all" not in hlo


@pytest.mark.usefixtures("unpartitionable_kernels")
@pytest.mark.parametrize("mesh_shape", [(8, 1, 1), (2, 1, 4), (1, 2, 4)])
def test_kernels_xla_cannot_partition_run_per_device_unchecked(mesh_shape):
  """GPU and TPU Pallas kernels (`pallas_kernels.partitionable` False) run inside shard_map
  without varying-axis checks (megablox declares none), on each device's tokens, with or
  without expert parallelism; the gradients of the replicated weights are then summed by
  shard_map's transpose instead of `pcast`. Forced here on CPU: the same results as one
  device."""
  layer = make_layer("sigma_moe")
  x, cotangent = inputs(3)
  assert_tree_close(run(layer, x, cotangent, mesh_shape), run(layer, x, cotangent))


@pytest.mark.parametrize("partitionable", [True, False])
def test_switchhead_on_a_data_parallel_mesh_equals_one_device(partitionable, monkeypatch):
  """SwitchHead's expert projections (`token_parallel_cvmm`): as XLA partitions them, or,
  for a kernel it cannot partition (forced here on CPU), each device on its own rows inside
  shard_map; values and gradients equal one device's."""
  layer = SwitchHeadAttention(D, 2, 8, 4, 2, n_layers=2, impl="blocked", rngs=nnx.Rngs(0))
  graphdef, params, rest = nnx.split(layer, nnx.Param, ...)
  x, cotangent = (jax.random.normal(k, (8, 6, D)) for k in jax.random.split(jax.random.key(5)))

  @jax.jit
  def forward_and_grads(params, x):
    def loss(params, x):
      y = nnx.merge(graphdef, params, rest)(x)
      return jnp.sum(y * cotangent), y
    (_, y), grads = jax.value_and_grad(loss, argnums=(0, 1), has_aux=True)(params, x)
    return y, nnx.to_pure_dict(grads[0]), grads[1]

  want = jax.device_get(forward_and_grads(params, x))
  monkeypatch.setattr(expert_parallel.pallas_kernels, "partitionable",
                      lambda impl: partitionable)
  jax.clear_caches()
  try:
    mesh = parallel.make_mesh((8, 1, 1))
    x = jax.device_put(x, parallel.batch_sharding(mesh, x.ndim))
    with jax.set_mesh(mesh):
      assert_tree_close(jax.device_get(forward_and_grads(params, x)), want)
  finally:
    jax.clear_caches()


@pytest.mark.usefixtures("unpartitionable_kernels")
@pytest.mark.parametrize("xl", [False, True])
def test_switchhead_gpu_kernels_split_by_head_equal_one_device(xl):
  """SwitchHead (RoPE, and its XL form, whose attention core is then the fused XL kernels
  too) with the Triton kernels (`impl="pallas"`, interpret mode) on tensor 4 and data 2 x
  tensor 4: each device runs its heads' V and O experts inside the unchecked map
  (`head_parallel`), the O projection's partial sums added by one psum; values and every
  gradient equal one device's gather oracle (with the XLA attention core)."""
  def make(impl):
    if xl:
      return SwitchHeadXLAttention(D, 4, 4, 4, 2, n_layers=2, impl=impl, rngs=nnx.Rngs(0))
    return SwitchHeadAttention(D, 4, 4, 4, 2, n_layers=2, impl=impl, rngs=nnx.Rngs(0))

  call = (lambda layer, x: layer(x, 4, jnp.asarray(2))) if xl else (lambda layer, x: layer(x))
  x, cotangent = (jax.random.normal(k, (4, 6, D)) for k in jax.random.split(jax.random.key(5)))
  cotangent = cotangent[:, -4:] if xl else cotangent

  @functools.partial(jax.jit, static_argnums=0)
  def forward_and_grads(graphdef, params, rest, x):
    def loss(params, x):
      y = call(nnx.merge(graphdef, params, rest), x)
      return jnp.sum(y * cotangent), y
    (_, y), grads = jax.value_and_grad(loss, argnums=(0, 1), has_aux=True)(params, x)
    return y, nnx.to_pure_dict(grads[0]), grads[1]

  want = jax.device_get(forward_and_grads(*nnx.split(make("gather"), nnx.Param, ...), x))
  graphdef, params, rest = nnx.split(make("pallas"), nnx.Param, ...)
  for mesh_shape in [(1, 1, 1, 4), (2, 1, 1, 4)]:
    mesh = parallel.make_mesh(mesh_shape)
    placed = jax.device_put(params, parallel.state_shardings(params, mesh))
    x_placed = jax.device_put(x, parallel.batch_sharding(mesh, x.ndim))
    with jax.set_mesh(mesh):
      jaxpr = str(jax.make_jaxpr(forward_and_grads, static_argnums=0)(graphdef, placed, rest,
                                                                      x_placed))
      assert set(re.findall(r"check_vma=(\w+)", jaxpr)) == {"False"}
      assert_tree_close(jax.device_get(forward_and_grads(graphdef, placed, rest, x_placed)),
                        want)
