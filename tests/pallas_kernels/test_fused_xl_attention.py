"""The fused Transformer-XL attention (`pallas_kernels.xl_attention`: the Triton kernels on a
GPU, interpret mode elsewhere; float32)
against the XLA path (`layers.xl_attention.attend_relative`, dropout off) and a float64 numpy
brute force: values and the gradients of q_u, q_v, k, v, r and a traced scale; odd head dims,
T not a multiple of the block, memory partly valid, none valid, none at all; the LM with
`model.attention_impl="pallas"` against "xla"; the config rules. Compiled for GPUs:
tests/aot/test_xl_attention_compile.py. (Not test_xl_attention.py: tests/layers has one, and
pytest's default import mode refuses two test modules of one basename.)"""

import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from sparse_jax import parallel
from sparse_jax.configs import default
from pallas_kernels import backends
from pallas_kernels.xl_attention import (XL_IMPLS, XLBlocks, XLTiles, use_fused, xl_attention,
                                         xl_blocks)
from sparse_jax.layers.xl_attention import RelativeMultiHeadAttention, attend_relative
from sparse_jax.models.lm import TransformerLM
from sparse_jax.models.lm_config import validate_model_config


# The kernel multiplies float32 tiles in IEEE float32 (`dot_precision`); the XLA path it is
# compared with does too only when told (on a GPU its default is TF32).
pytestmark = pytest.mark.usefixtures("full_float32_matmuls")


def _inputs(b, t, m, h, d, seed=0):
  keys = jax.random.split(jax.random.key(seed), 5)
  kk = m + t
  return (jax.random.normal(keys[0], (b, t, h, d)), jax.random.normal(keys[1], (b, t, h, d)),
          jax.random.normal(keys[2], (b, kk, h, d)), jax.random.normal(keys[3], (b, kk, h, d)),
          jax.random.normal(keys[4], (kk, h, d)))


def _xla(*args, mem_valid):
  q_u, q_v, k, v, r, scale = args
  return attend_relative(q_u, q_v, k, v, r, scale, jnp.asarray(mem_valid),
                         nnx.Dropout(0.0, rngs=nnx.Rngs(0)))


def _fused(*args, mem_valid):
  return xl_attention(*args, mem_valid)  # compiled on a GPU, interpret mode elsewhere


def _value_and_grads(attend, args, mem_valid):
  """Output and the gradients of sum(sin(out) * w) in every input (scale traced)."""
  weights = jax.random.normal(jax.random.key(7), args[0].shape)
  loss = lambda *a: jnp.sum(jnp.sin(attend(*a, mem_valid=mem_valid)) * weights)
  return attend(*args, mem_valid=mem_valid), jax.grad(loss, argnums=tuple(range(6)))(*args)


# (B, T, M, H, Dh, mem_valid): odd head dims (41 the WT-103 S one), T past one block and not
# a multiple of it, memory partly valid, none valid, no memory.
SHAPES = [(2, 5, 3, 2, 7, 2), (1, 40, 24, 2, 41, 11), (1, 37, 20, 1, 9, 0), (2, 33, 0, 1, 5, 0)]


@pytest.mark.parametrize("b, t, m, h, d, mem_valid", SHAPES)
def test_fused_equals_the_xla_path_in_values_and_gradients(b, t, m, h, d, mem_valid):
  args = (*_inputs(b, t, m, h, d), jnp.float32(0.3))
  out, grads = _value_and_grads(_fused, args, mem_valid)
  ref_out, ref_grads = _value_and_grads(_xla, args, mem_valid)
  np.testing.assert_allclose(out, ref_out, atol=2e-5, rtol=1e-5)
  for name, got, want in zip(("q_u", "q_v", "k", "v", "r", "scale"), grads, ref_grads):
    np.testing.assert_allclose(got, want, atol=1e-4, rtol=1e-4, err_msg=name)


def test_any_tiles_give_the_same_values_and_gradients():
  """The sweep's tiles (`XLTiles`, each kernel its own, unlike the rule's) change nothing but
  speed: every kernel tiled otherwise than the rule, against the XLA path."""
  b, t, m, h, d, mem_valid = 1, 40, 24, 2, 41, 11
  tiles = XLTiles(forward=XLBlocks(q=16, k=32, d=64), dkdv=XLBlocks(q=32, k=16, d=64),
                  dq=XLBlocks(q=16, k=16, d=64))
  assert all(getattr(tiles, kernel) != xl_blocks(t, m + t, d, jnp.float32, kernel)
             for kernel in ("forward", "dkdv", "dq"))
  args = (*_inputs(b, t, m, h, d, seed=3), jnp.float32(0.3))
  tiled = lambda *a, mem_valid: xl_attention(*a, mem_valid, tiles=tiles)
  out, grads = _value_and_grads(tiled, args, mem_valid)
  ref_out, ref_grads = _value_and_grads(_xla, args, mem_valid)
  np.testing.assert_allclose(out, ref_out, atol=2e-5, rtol=1e-5)
  for name, got, want in zip(("q_u", "q_v", "k", "v", "r", "scale"), grads, ref_grads):
    np.testing.assert_allclose(got, want, atol=1e-4, rtol=1e-4, err_msg=name)


def _numpy_xl(q_u, q_v, k, v, r, scale, mem_valid):
  """The definition, one query, head and key at a time, in float64."""
  b, t, h, _ = q_u.shape
  kk = k.shape[1]
  m = kk - t
  out = np.zeros(q_u.shape)
  for bi in range(b):
    for hi in range(h):
      for i in range(t):
        keys = [j for j in range(kk) if m - mem_valid <= j <= m + i]
        s = np.array([(q_u[bi, i, hi] @ k[bi, j, hi]
                       + q_v[bi, i, hi] @ r[kk - 1 - (m + i - j), hi]) * scale for j in keys])
        w = np.exp(s - s.max())
        w /= w.sum()
        out[bi, i, hi] = sum(wj * v[bi, j, hi] for wj, j in zip(w, keys))
  return out


def test_fused_equals_a_float64_brute_force():
  b, t, m, h, d, mem_valid = 1, 6, 4, 2, 3, 3
  args = _inputs(b, t, m, h, d, seed=1)
  out = _fused(*args, jnp.float32(0.7), mem_valid=mem_valid)
  want = _numpy_xl(*[np.asarray(a, np.float64) for a in args], 0.7, mem_valid)
  np.testing.assert_allclose(out, want, atol=1e-5, rtol=1e-5)
  # Gradient of the brute force by central differences in a few entries of r and q_v.
  weights = np.random.default_rng(0).normal(size=out.shape)
  grads = jax.grad(lambda q_v, r: jnp.sum(_fused(args[0], q_v, args[2], args[3], r,
                                                 jnp.float32(0.7), mem_valid=mem_valid)
                                          * weights), argnums=(0, 1))(args[1], args[4])
  base = [np.asarray(a, np.float64) for a in args]
  for which, index in ((1, (0, 2, 1, 0)), (4, (5, 0, 2)), (4, (3, 1, 1)), (4, (9, 0, 0))):
    plus, minus = [list(base) for _ in range(2)]
    plus[which], minus[which] = base[which].copy(), base[which].copy()
    plus[which][index] += 1e-6
    minus[which][index] -= 1e-6
    numeric = np.sum((_numpy_xl(*plus, 0.7, mem_valid) - _numpy_xl(*minus, 0.7, mem_valid))
                     * weights) / 2e-6
    got = grads[0 if which == 1 else 1][index]
    np.testing.assert_allclose(got, numeric, atol=1e-4, rtol=1e-4)


def test_a_fixed_python_scale_and_eager_mem_valid_work():
  args = _inputs(1, 9, 4, 1, 6)
  out = xl_attention(*args, 0.25, 4)
  np.testing.assert_allclose(out, _xla(*args, 0.25, mem_valid=4), atol=2e-5, rtol=1e-5)


def test_the_block_rule_pads_the_head_and_fits_small_problems():
  blocks = xl_blocks(256, 512, 41, jnp.bfloat16)
  assert (blocks.q, blocks.k, blocks.d) == (64, 64, 64)
  assert xl_blocks(256, 512, 41, jnp.bfloat16, "dq").q == 32
  assert (xl_blocks(5, 8, 7, jnp.float32).q, xl_blocks(5, 8, 7, jnp.float32).d) \
      == (16, 16)


def test_auto_picks_the_fused_path_on_one_gpu_and_pallas_refuses_dropout(monkeypatch):
  assert use_fused("pallas", 0.0) and not use_fused("xla", 0.0)
  one, two = (jax.sharding.AbstractMesh((n,), ("data",)) for n in (1, 2))
  with jax.sharding.use_abstract_mesh(one):
    assert not use_fused("auto", 0.0)  # These tests trace for the CPU.
  monkeypatch.setattr(backends, "target_platform", lambda: "gpu")
  with jax.sharding.use_abstract_mesh(one):
    assert use_fused("auto", 0.0)
    assert not use_fused("auto", 0.1)  # the XLA path, which has dropout; no error
  with jax.sharding.use_abstract_mesh(two):
    assert not use_fused("auto", 0.0)  # a Pallas call cannot be split over a mesh
  with pytest.raises(ValueError, match="attn_dropout"):
    use_fused("pallas", 0.1)
  with pytest.raises(ValueError, match="attn_dropout"):
    RelativeMultiHeadAttention(8, 2, 4, n_layers=1, attn_dropout=0.1, impl="pallas",
                               rngs=nnx.Rngs(0))


@functools.partial(jax.jit, static_argnums=0)
def _layer_value_and_grads(graphdef, params, rest, ctx, cotangent):
  """The layer's output on `ctx` (its last 6 rows the queries, 3 of its 4 memory rows valid)
  and the gradients of `sum(out * cotangent)` in its parameters and `ctx`."""

  def loss(params, ctx):
    out = nnx.merge(graphdef, params, rest)(ctx, 6, jnp.asarray(3))
    return jnp.sum(out * cotangent), out

  (_, out), grads = jax.value_and_grad(loss, argnums=(0, 1), has_aux=True)(params, ctx)
  return out, nnx.to_pure_dict(grads[0]), grads[1]


def test_the_fused_layer_on_meshes_runs_per_device_and_equals_one_device():
  """`model.attention_impl=pallas` on tensor 4, data 2 x tensor 4 and fsdp 2 x expert 2 x
  tensor 2 (4 heads, batch 4): the kernels run inside one unchecked `shard_map` on each
  device's rows and heads, and the output and every gradient (the learned scale's, summed
  over all devices by the map's transpose, and the position projection's, over the batch
  axes) equal one device's to float32 reduction order."""
  layer = RelativeMultiHeadAttention(16, 4, 4, n_layers=2, learned_scale=True,
                                     bias_init_std=0.5, impl="pallas", rngs=nnx.Rngs(0))
  graphdef, params, rest = nnx.split(layer, nnx.Param, ...)
  ctx, cotangent = (jax.random.normal(key, shape) for key, shape in zip(
      jax.random.split(jax.random.key(3)), [(4, 10, 16), (4, 6, 16)]))
  want = jax.device_get(_layer_value_and_grads(graphdef, params, rest, ctx, cotangent))
  for shape in [(1, 1, 1, 4), (2, 1, 1, 4), (1, 2, 2, 2)]:
    mesh = parallel.make_mesh(shape)
    placed = jax.device_put(params, parallel.state_shardings(params, mesh))
    ctx_placed = jax.device_put(ctx, parallel.batch_sharding(mesh, 3))
    with jax.set_mesh(mesh):
      jaxpr = str(jax.make_jaxpr(_layer_value_and_grads, static_argnums=0)(
          graphdef, placed, rest, ctx_placed, cotangent))
      got = jax.device_get(_layer_value_and_grads(graphdef, placed, rest, ctx_placed,
                                                  cotangent))
    # Forward and backward each one map around the kernels.
    assert re.findall(r"check_vma=(\w+)", jaxpr) == ["False", "False"], shape
    jax.tree.map_with_path(lambda path, g, w: np.testing.assert_allclose(
        g, w, rtol=1e-5, atol=1e-6 * np.abs(w).max(), err_msg=f"{shape} {path}"), got, want)


def _lm_config(**overrides):
  cfg = default.get_config().model
  cfg.update(d_model=24, n_layers=2, n_heads=2, head_dim=7, mem_len=6, dropout=0.0,
             vocab_size=64)
  cfg.ff.update(n_experts=4, expert_size=8, k=2, expert_dropout=0.0)
  cfg.update(**overrides)
  return cfg


@pytest.mark.parametrize("attn_scale", ["fixed", "learned"])
def test_the_lm_with_the_fused_path_equals_the_xla_path(attn_scale):
  """Two segments (the second attends to the first's memory): logits and parameter grads."""
  tokens = jnp.asarray(np.random.default_rng(0).integers(0, 64, (2, 2, 5)), jnp.int32)
  results = {}
  for impl in ("xla", "pallas"):
    lm = TransformerLM(_lm_config(attention_impl=impl, attn_scale=attn_scale),
                       rngs=nnx.Rngs(0))
    graphdef, params, rest = nnx.split(lm, nnx.Param, ...)

    def loss(params):
      model = nnx.merge(graphdef, params, rest)
      logits_a, memory, _ = model(tokens[0])
      logits_b, _, _ = model(tokens[1], memory)
      return jnp.sum(jnp.sin(logits_a)) + jnp.sum(jnp.sin(logits_b)), (logits_a, logits_b)

    (_, logits), grads = jax.value_and_grad(loss, has_aux=True)(params)
    results[impl] = logits, grads
  for got, want in zip(results["pallas"][0], results["xla"][0]):
    np.testing.assert_allclose(got, want, atol=2e-5, rtol=1e-5)
  flat_got = jax.tree.leaves(results["pallas"][1])
  flat_want = jax.tree.leaves(results["xla"][1])
  assert len(flat_got) == len(flat_want)
  for got, want in zip(flat_got, flat_want):
    np.testing.assert_allclose(got, want, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("overrides, field", [
    ({"attention_impl": "pallas", "attn_dropout": 0.1}, "model.attn_dropout"),
    ({"attention_impl": "blocked"}, "model.attention_impl"),
    ({"attention": "causal", "attention_impl": "xla"}, "model.attention_impl"),
])
def test_bad_xl_impl_configs_name_the_field(overrides, field):
  with pytest.raises(ValueError, match=field.replace(".", r"\.")):
    validate_model_config(_lm_config(**overrides))


def test_xl_impl_configs_validate():
  for impl in XL_IMPLS:
    validate_model_config(_lm_config(attention_impl=impl))
  validate_model_config(_lm_config(attention_impl="auto", attn_dropout=0.1))
