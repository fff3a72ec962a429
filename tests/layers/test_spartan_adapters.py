"""SPARTAN memory (Eq. 1-3) and bottleneck adapters against float64 numpy references."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.test_util import check_grads

from sparse_jax.layers.adapters import BottleneckAdapter, adapted_residual, adapter_params
from sparse_jax.layers.counting import count_params
from sparse_jax.layers.spartan import (SpartanMemory, gather_children, select_parents,
                                       spartan_memory, spartan_params)

D, N_P, N_C, K = 8, 6, 3, 3


def _softmax(z):
  e = np.exp(z - z.max())
  return e / e.sum()


def spartan_reference(x_nd, parents, keys, values, top_k, temperature):
  """Eq. 1-3 written per position; returns outputs and each position's chosen parents."""
  outputs, chosen = [], []
  for v in x_nd:
    g = _softmax(parents @ v)                                        # Eq. 1
    top = np.argsort(-g, kind="stable")[:top_k]
    v_o = sum(g[i] * values[i].T @ _softmax(keys[i] @ v / temperature) for i in top)  # Eq. 2
    outputs.append(v + v_o / g[top].sum())                           # Eq. 3
    chosen.append(set(top.tolist()))
  return np.array(outputs), chosen


def _random_memory(rng, d=D, n_p=N_P, n_c=N_C):
  return (rng.normal(size=(n_p, d)), rng.normal(size=(n_p, n_c, d)),
          rng.normal(size=(n_p, n_c, d)))


def _set_params(layer, parents, keys, values):
  layer.parents[...] = jnp.asarray(parents, jnp.float32)
  layer.child_keys[...] = jnp.asarray(keys, jnp.float32)
  layer.child_values[...] = jnp.asarray(values, jnp.float32)


@pytest.mark.parametrize("read", ["gather", "dense"])
@pytest.mark.parametrize("temperature", [1.0, 1.6])
def test_spartan_matches_float64_reference(temperature, read):
  rng = np.random.default_rng(0)
  params = [p.astype(np.float32) for p in _random_memory(rng)]
  layer = SpartanMemory(D, N_P, N_C, K, temperature=temperature, read=read, rngs=nnx.Rngs(0))
  _set_params(layer, *params)
  x = rng.normal(size=(2, 5, D)).astype(np.float32)
  y, aux = layer(jnp.asarray(x))
  want, chosen = spartan_reference(x.reshape(-1, D).astype(np.float64),
                                   *[p.astype(np.float64) for p in params], K, temperature)
  assert y.shape == x.shape and y.dtype == jnp.float32
  np.testing.assert_allclose(np.asarray(y).reshape(-1, D), want, rtol=1e-5, atol=1e-6)
  usage = np.bincount([i for top in chosen for i in top], minlength=N_P)
  np.testing.assert_array_equal(aux["parent_usage"], usage)
  assert aux["reg_loss"].shape == () and aux["reg_loss"].dtype == jnp.float32


def test_only_the_chosen_parents_children_are_read():
  rng = np.random.default_rng(1)
  n_p, top_k = 16, 2
  parents, keys, values = _random_memory(rng, n_p=n_p)
  x_nd = jnp.asarray(rng.normal(size=(3, D)), jnp.float32)
  _, ids_nk = select_parents(x_nd, jnp.asarray(parents, jnp.float32), top_k)
  unused = np.setdiff1d(np.arange(n_p), np.asarray(ids_nk))
  assert unused.size >= n_p - 3 * top_k
  poisoned_keys, poisoned_values = keys.copy(), values.copy()
  poisoned_keys[unused] = np.nan
  poisoned_values[unused] = np.nan

  def run(k, v):
    return spartan_memory(x_nd, *[jnp.asarray(a, jnp.float32) for a in (parents, k, v)],
                          top_k=top_k)[0]

  clean, poisoned = run(keys, values), run(poisoned_keys, poisoned_values)
  assert np.all(np.isfinite(poisoned))
  np.testing.assert_array_equal(poisoned, clean)
  keys_nkcd, values_nkcd = gather_children(jnp.asarray(keys), jnp.asarray(values), ids_nk)
  assert keys_nkcd.shape == values_nkcd.shape == (3, top_k, N_C, D)


@pytest.mark.parametrize("read", ["gather", "dense"])
def test_spartan_gradients_match_finite_differences_in_float64(read):
  rng = np.random.default_rng(2)
  with jax.enable_x64(True):
    parents, keys, values = [jnp.asarray(p, jnp.float64) for p in _random_memory(rng)]
    x_nd = jnp.asarray(rng.normal(size=(4, D)), jnp.float64)
    sorted_logits = -np.sort(-np.asarray(x_nd @ parents.T), axis=-1)
    assert np.min(sorted_logits[:, K - 1] - sorted_logits[:, K]) > 1e-2  # no top-K flips

    def f(x, p, k, v):
      return spartan_memory(x, p, k, v, top_k=K, temperature=1.6, read=read)[0]

    check_grads(f, (x_nd, parents, keys, values), order=1, modes=("rev",))


def test_spartan_init_is_near_identity_and_counts_are_closed_form():
  d, n_p, n_c, top_k = 64, 16, 3, 8
  layer = SpartanMemory(d, n_p, n_c, top_k, rngs=nnx.Rngs(0))
  x = jax.random.normal(jax.random.key(3), (2, 4, d))
  y, _ = layer(x)
  assert float(jnp.linalg.norm(y - x) / jnp.linalg.norm(x)) < 0.05
  assert count_params(layer) == spartan_params(d, n_p, n_c) == (n_p + 2 * n_p * n_c) * d
  assert layer.read == "dense"  # auto: K = N_p / 2 chosen, so all children are read densely.
  assert layer.flops_per_token() == (n_p + 2 * n_p * n_c) * d
  sparse = SpartanMemory(d, n_p, n_c, top_k, read="gather", rngs=nnx.Rngs(0))
  assert sparse.flops_per_token() == (n_p + 2 * top_k * n_c) * d
  np.testing.assert_allclose(sparse(x)[0], y, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("kwargs, field", [({"top_k": 7}, "top_k"), ({"top_k": 0}, "top_k"),
                                           ({"n_children": 0}, "n_children"),
                                           ({"temperature": 0.0}, "temperature")])
def test_spartan_rejects_bad_arguments(kwargs, field):
  args = {"n_parents": 6, "n_children": 2, "top_k": 2, **kwargs}
  with pytest.raises(ValueError, match=field):
    SpartanMemory(D, **args, rngs=nnx.Rngs(0))


def _gelu(h):
  return 0.5 * h * (1 + np.vectorize(math.erf)(h / math.sqrt(2)))


NUMPY_ACTIVATIONS = {"relu": lambda h: np.maximum(h, 0), "gelu": _gelu,
                     "swish": lambda h: h / (1 + np.exp(-h))}


def _random_adapter(d, b, rng, **kwargs):
  """An adapter with random float32 weights, and those weights in float64."""
  adapter = BottleneckAdapter(d, b, rngs=nnx.Rngs(0), **kwargs)
  params = {name: rng.normal(size=shape).astype(np.float32) for name, shape in
            [("w_down", (d, b)), ("b_down", (b,)), ("w_up", (b, d)), ("b_up", (d,))]}
  for name, value in params.items():
    getattr(adapter, name)[...] = jnp.asarray(value)
  return adapter, {k: v.astype(np.float64) for k, v in params.items()}


def _bottleneck(z, p, activation):
  return NUMPY_ACTIVATIONS[activation](z @ p["w_down"] + p["b_down"]) @ p["w_up"] + p["b_up"]


@pytest.mark.parametrize("activation", ["relu", "gelu", "swish"])
def test_adapter_bottleneck_matches_numpy_definition(activation):
  rng = np.random.default_rng(4)
  adapter, p = _random_adapter(D, 4, rng, activation=activation)
  z = rng.normal(size=(2, 3, D)).astype(np.float32)
  want = _bottleneck(z.astype(np.float64), p, activation)
  np.testing.assert_allclose(adapter(jnp.asarray(z)), want, rtol=1e-5, atol=1e-5)


def _layer_norm(y):
  mean, var = y.mean(-1, keepdims=True), y.var(-1, keepdims=True)
  return (y - mean) / np.sqrt(var + 1e-5)


@pytest.mark.parametrize("original_ln_before", [False, True])
@pytest.mark.parametrize("post_ln", [False, True])
def test_adapted_residual_is_adapterhubs_bottleneck_layer(original_ln_before, post_ln):
  """AdapterHub (`Adapter.pre_forward`, `forward`, `post_forward` with residual_before_ln):
  the residual around the bottleneck is the sublayer output h; the input is h, or LN(h + x)
  with original_ln_before; the result LN(A + h + x). Pre-LN blocks pass no LayerNorm."""
  rng = np.random.default_rng(5)
  adapter, p = _random_adapter(D, 3, rng, activation="swish",
                               original_ln_before=original_ln_before)
  h, x = (rng.normal(size=(2, 4, D)).astype(np.float32) for _ in range(2))
  norm64 = _layer_norm if post_ln else (lambda y: y)
  norm32 = (lambda y: (y - y.mean(-1, keepdims=True))
            * jax.lax.rsqrt(y.var(-1, keepdims=True) + 1e-5)) if post_ln else None
  h64, x64 = h.astype(np.float64), x.astype(np.float64)
  residual = h64
  adapter_in = norm64(h64 + x64) if original_ln_before else h64
  want = norm64(_bottleneck(adapter_in, p, "swish") + residual + x64)
  got = adapted_residual(adapter, jnp.asarray(h), jnp.asarray(x), norm32)
  np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5)
  np.testing.assert_allclose(adapted_residual(None, jnp.asarray(h), jnp.asarray(x), norm32),
                             norm64(h64 + x64), rtol=1e-5, atol=1e-5)


def test_adapter_inits_and_counts():
  """"bert" (AdapterHub's default): N(0, 0.02^2) weights, zero biases; "near_identity":
  truncated N(0, 1e-2^2) down projection, zero up projection, so A(z) = 0 exactly."""
  d, b = 256, 64
  bert = BottleneckAdapter(d, b, rngs=nnx.Rngs(0))
  for w in (bert.w_down[...], bert.w_up[...]):
    # The sample std of n = 16384 normals is within 3% of 0.02 with overwhelming probability.
    assert float(jnp.std(w)) == pytest.approx(0.02, rel=0.03)
    assert abs(float(jnp.mean(w))) < 0.02 * 4 / math.sqrt(w.size)
  assert not jnp.any(bert.b_down[...]) and not jnp.any(bert.b_up[...])
  identity = BottleneckAdapter(d, b, activation="gelu", init="near_identity", rngs=nnx.Rngs(0))
  assert float(jnp.abs(identity.w_down[...]).max()) <= 2e-2
  assert float(jnp.std(identity.w_down[...])) == pytest.approx(0.0088, rel=0.05)  # 1e-2 * 0.88
  z = jax.random.normal(jax.random.key(5), (2, 3, d))
  np.testing.assert_array_equal(identity(z), jnp.zeros_like(z))
  assert count_params(bert) == adapter_params(d, b, per_layer=1, n_layers=1)
  assert adapter_params(768, 64, per_layer=2, n_layers=12) == 24 * (2 * 768 * 64 + 64 + 768)
  assert bert.flops_per_token() == 2 * d * b
  for bad in ({"activation": "tanh"}, {"init": "xavier"}):
    with pytest.raises(ValueError, match=next(iter(bad))):
      BottleneckAdapter(d, b, rngs=nnx.Rngs(0), **bad)
