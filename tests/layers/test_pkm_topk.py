"""Product-key memory and the Top-K activation against brute-force float64 references."""

import jax
import jax.numpy as jnp
import jax.test_util
import numpy as np
import pytest
from flax import nnx

from sparse_jax import parallel
from sparse_jax.layers.pkm import (PKM, gathered_value_sum_over_tensor, product_key_topk,
                                   use_dense_read, weighted_value_sum)
from sparse_jax.layers.topk_ff import TopKFF, split_top_k_mask, top_k_mask


@pytest.mark.parametrize("knn", [5, 11, 30])  # knn < n_subkeys, = n_subkeys, > n_subkeys
def test_two_stage_top_k_is_the_top_k_of_all_products(knn):
  rng = np.random.default_rng(knn)
  n, h, s = 9, 3, 11
  scores_a = rng.normal(size=(n, h, s)).astype(np.float32)
  scores_b = rng.normal(size=(n, h, s)).astype(np.float32)
  got_scores, got_ids = product_key_topk(jnp.asarray(scores_a), jnp.asarray(scores_b), knn)
  for i in range(n):
    for head in range(h):
      # Eq. 8: u[j * s + a] = u_b[j] + u_a[a], all s^2 of them.
      full = (scores_b[i, head][:, None] + scores_a[i, head][None, :]).reshape(-1)
      want_ids = np.argsort(-full, kind="stable")[:knn]
      np.testing.assert_array_equal(got_ids[i, head], want_ids)
      np.testing.assert_allclose(got_scores[i, head], full[want_ids], rtol=1e-6)


@pytest.mark.parametrize("activation", ["relu", "softmax"])
def test_pkm_output_matches_float64_reference(activation):
  d, s, knn, heads = 8, 7, 3, 2
  pkm = PKM(d, s, knn, n_layers=2, n_heads=heads, activation=activation, rngs=nnx.Rngs(0))
  x = jax.random.normal(jax.random.key(1), (2, 5, d))
  y, aux = pkm(x)
  keys = np.asarray(pkm.sub_keys[...], np.float64)
  values = np.asarray(pkm.values[...], np.float64)
  for n, x_n in enumerate(np.asarray(x, np.float64).reshape(-1, d)):
    weights, ids = [], []
    for h in range(heads):
      full = ((x_n[d // 2:] @ keys[h, 1].T)[:, None] + (x_n[:d // 2] @ keys[h, 0].T)[None, :])
      top = np.argsort(-full.reshape(-1))[:knn]
      ids.extend(top)
      weights.extend(full.reshape(-1)[top])
    weights = np.array(weights)
    if activation == "relu":
      weights = np.maximum(weights, 0)
    else:
      weights = np.exp(weights - weights.max()) / np.exp(weights - weights.max()).sum()
    want = weights @ values[np.array(ids)]
    np.testing.assert_allclose(np.asarray(y).reshape(-1, d)[n], want, rtol=1e-4, atol=1e-6)
  assert int(aux["value_usage"].sum()) == 10 * heads * knn
  assert sum(p.size for p in jax.tree.leaves(nnx.state(pkm, nnx.Param))) == (
      heads * s * d + s * s * d)


@pytest.mark.parametrize("dense", [False, True])
def test_both_value_reads_equal_the_weighted_sum_with_gradients(dense):
  rng = np.random.default_rng(3)
  n, h, knn, v, d = 6, 2, 3, 10, 4
  ids = rng.integers(0, v, size=(n, h, knn))
  ids[0, 1] = ids[0, 0]  # the same value chosen by two heads: its weights add up
  weights = rng.normal(size=(n, h, knn))
  values = rng.normal(size=(v, d))
  want = np.einsum("nhk,nhkd->nd", weights, values[ids])
  with jax.enable_x64(True):
    read = lambda w, t: weighted_value_sum(w, jnp.asarray(ids), t, dense=dense)
    np.testing.assert_allclose(read(jnp.asarray(weights), jnp.asarray(values)), want,
                               rtol=1e-12)
    jax.test_util.check_grads(read, (jnp.asarray(weights), jnp.asarray(values)), order=1,
                              modes=["rev"])
  assert use_dense_read(900, 4, 16) and not use_dense_read(512 ** 2, 4, 32)


def test_pkm_dense_init_matches_the_dense_baseline_scales():
  pkm = PKM(64, 32, 4, n_layers=2, init="dense", rngs=nnx.Rngs(0))
  assert float(jnp.std(pkm.sub_keys[...])) == pytest.approx(np.sqrt(2 / (64 * 2)), rel=0.05)
  assert float(jnp.std(pkm.values[...])) == pytest.approx(np.sqrt(2 / (32 * 32 * 2)), rel=0.05)


def test_topk_ff_keeps_exactly_k_units_and_matches_numpy():
  d, d_ff, k = 10, 64, 5
  layer = TopKFF(d, d_ff, k, n_layers=2, rngs=nnx.Rngs(0))
  layer.b_up[...] = jnp.full((d_ff,), 0.5)  # most units positive: the K largest are non-zero
  x = jax.random.normal(jax.random.key(2), (3, 4, d))
  pre = np.asarray(x, np.float64) @ np.asarray(layer.w_up[...], np.float64) + 0.5
  u = np.maximum(pre, 0)
  kth = np.sort(u, axis=-1)[..., -k][..., None]
  u_top = np.where(u >= kth, u, 0)
  assert np.all((u_top > 0).sum(-1) == k)
  want = u_top @ np.asarray(layer.w_down[...], np.float64) + np.asarray(layer.b_down[...])
  y, _ = layer(x)
  np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-5)
  hidden = layer.hidden(jnp.asarray(pre, jnp.float32))
  assert np.all(np.count_nonzero(np.asarray(hidden), axis=-1) == k)
  assert layer.flops_per_token() == d * d_ff + k * d


def test_the_gathered_read_split_over_tensor_equals_one_devices_with_its_gradients():
  """8 tokens read 2 heads x 3 of 64 values (repeats included); on data 2 x tensor 4 each
  device reads the rows it holds: the sum and the gradients of the weights and of the table
  equal the one-device gather's (f32; only the order of the partial sums differs)."""
  rng = np.random.default_rng(0)
  weights = jnp.asarray(rng.normal(size=(8, 2, 3)), jnp.float32)
  ids = jnp.asarray(rng.integers(0, 64, (8, 2, 3)), jnp.int32)
  values = jnp.asarray(rng.normal(size=(64, 6)), jnp.float32)

  def objective(read):
    return jax.value_and_grad(lambda w, v: jnp.sum(jnp.sin(read(w, ids, v))), argnums=(0, 1))

  want = objective(lambda w, i, v: weighted_value_sum(w, i, v, dense=False))(weights, values)
  with jax.set_mesh(parallel.make_mesh((2, 1, 1, 4))):
    got = jax.jit(objective(gathered_value_sum_over_tensor))(weights, values)
  jax.tree.map(lambda g, w: np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6), got, want)


@pytest.mark.parametrize("shape, k", [((1, 1, 1, 8), 3), ((1, 1, 1, 8), 9),
                                      ((2, 1, 1, 4), 5)])
def test_the_top_k_chosen_across_tensor_devices_is_one_devices_ties_included(shape, k):
  """Rows of 32 small integers (many ties, zeros among them, as ReLU's) split over `tensor`:
  each device's candidates (k of its units, or all of them when it has fewer: k = 9 of 4)
  give exactly one device's choice, the lowest indices among equal values."""
  u = jnp.asarray(np.random.default_rng(k).integers(0, 4, (4, 3, 32)), jnp.float32)
  want = top_k_mask(u, k)
  assert np.all(np.asarray(want).sum(-1) == k)
  with jax.set_mesh(parallel.make_mesh(shape)):
    got = jax.jit(split_top_k_mask, static_argnums=1)(u, k)
  np.testing.assert_array_equal(got, want)


def test_dense_and_topk_parameter_counts_are_the_closed_form():
  d, d_ff = 10, 48
  layer = TopKFF(d, d_ff, 4, n_layers=2, rngs=nnx.Rngs(0))
  assert sum(p.size for p in jax.tree.leaves(nnx.state(layer, nnx.Param))) == (
      2 * d * d_ff + d_ff + d)
