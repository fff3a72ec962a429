"""Expert parallelism: every MoE kind on (data, fsdp, expert) meshes equals one device.

The meshed layer runs as `with jax.set_mesh(mesh): jax.jit(f)(...)` on the 8 CPU devices of
conftest.py, with parameters and the batch placed as training places them
(`parallel.state_shardings`, `parallel.batch_sharding`).
"""

import functools

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from flax import nnx

from sparse_jax import parallel
from sparse_jax.layers import build_ff, expert_parallel
from sparse_jax.training.steps import make_rngs

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
