"""Scaling Transformers' SparseFF and multiplicative dense layer."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from sparse_jax.layers.multiplicative_dense import MultiplicativeDense
from sparse_jax.layers.sparse_ff import SparseFF, straight_through

D, D_FF, N = 12, 48, 8


def make_sparse_ff(**kwargs):
  return SparseFF(D, D_FF, N, 6, rngs=nnx.Rngs(0), **kwargs)


def test_eval_mask_has_one_unit_per_block_and_decode_matches_dense_float64():
  ff = make_sparse_ff()
  ff.eval()
  x = jax.random.normal(jax.random.key(1), (3, 5, D))
  mask = np.asarray(ff.mask(x)).reshape(3, 5, D_FF // N, N)
  np.testing.assert_array_equal(mask.sum(-1), 1.0)
  # Float64 hard-mask dense computation: ReLU(x W1 + b1) * mask, then W2.
  p = {k: np.asarray(v, np.float64) for k, v in nnx.to_pure_dict(nnx.state(ff, nnx.Param)).items()}
  x64 = np.asarray(x, np.float64)
  logits = ((x64 @ p["c_down"]) @ p["c_up"] + p["c_bias"]).reshape(3, 5, D_FF // N, N)
  hard = (logits == logits.max(-1, keepdims=True)).reshape(3, 5, D_FF)
  want = (np.maximum(x64 @ p["w_keys"].T + p["b_up"], 0) * hard) @ p["w_values"] + p["b_down"]
  np.testing.assert_allclose(ff(x)[0], want, rtol=1e-4, atol=1e-5)
  np.testing.assert_allclose(ff.decode(x), want, rtol=1e-4, atol=1e-5)
  np.testing.assert_allclose(ff.decode(x[0, 0]), want[0, 0], rtol=1e-4, atol=1e-5)


def test_straight_through_gradient_is_the_soft_gradient():
  logits = jax.random.normal(jax.random.key(2), (4, N))
  cotangent = jax.random.normal(jax.random.key(3), (4, N))

  def st_mask(l):
    soft = jax.nn.softmax(l)
    return straight_through(jax.nn.one_hot(jnp.argmax(l, -1), N), soft)

  _, st_vjp = jax.vjp(st_mask, logits)
  _, soft_vjp = jax.vjp(jax.nn.softmax, logits)
  np.testing.assert_allclose(st_vjp(cotangent)[0], soft_vjp(cotangent)[0], rtol=1e-6)
  # hard + soft - soft: the forward value is the one-hot up to float32 rounding.
  np.testing.assert_allclose(st_mask(logits), jax.nn.one_hot(jnp.argmax(logits, -1), N),
                             atol=1e-6)


def test_training_masks_are_hard_with_quant_prob_one_and_soft_with_zero():
  x = jax.random.normal(jax.random.key(4), (6, D))
  hard = make_sparse_ff(quant_prob=1.0).mask(x).reshape(6, -1, N)
  np.testing.assert_allclose(hard.sum(-1), 1.0, rtol=1e-6)
  assert np.all(np.isin(np.round(np.asarray(hard), 6), [0.0, 1.0]))
  soft = np.asarray(make_sparse_ff(quant_prob=0.0).mask(x)).reshape(6, -1, N)
  np.testing.assert_allclose(soft.sum(-1), 1.0, rtol=1e-5)
  assert np.mean((soft > 1e-6) & (soft < 1 - 1e-6)) > 0.05  # genuinely soft


def test_sparse_ff_parameter_count_and_decode_flops():
  ff = make_sparse_ff()
  assert sum(p.size for p in jax.tree.leaves(nnx.state(ff, nnx.Param))) == (
      2 * D * D_FF + D_FF + D + D * 6 + 6 * D_FF + D_FF)
  assert ff.flops_per_token() == D * 6 + 6 * D_FF + 2 * D * (D_FF // N)


def test_multiplicative_dense_represents_any_permutation():
  """Theorem 1: for a bijection f(i) = (s, m), D[i, s] = [f(i)_0 = s], E[i, m] = [f(i)_1 = m]."""
  d, s = 12, 4
  m = d // s
  layer = MultiplicativeDense(d, d, s, rngs=nnx.Rngs(0))
  f = np.random.default_rng(0).permutation(d)  # f(i) = (f[i] // m, f[i] % m)
  layer.d_is[...] = jnp.asarray(np.eye(s)[f // m], jnp.float32)
  layer.e_im[...] = jnp.asarray(np.eye(m)[f % m], jnp.float32)
  x = jax.random.normal(jax.random.key(5), (7, d))
  y = np.asarray(layer(x))
  np.testing.assert_array_equal(y[:, f], np.asarray(x))
  assert sum(p.size for p in jax.tree.leaves(nnx.state(layer, nnx.Param))) == d * (s + m)


def test_multiplicative_dense_matches_its_definition_in_float64():
  layer = MultiplicativeDense(10, 12, 3, rngs=nnx.Rngs(1))
  x = np.random.default_rng(1).normal(size=(5, 10))
  d64, e64 = np.asarray(layer.d_is[...], np.float64), np.asarray(layer.e_im[...], np.float64)
  want = np.zeros((5, 3, 4))
  for n, s, m, i in np.ndindex(5, 3, 4, 10):
    want[n, s, m] += x[n, i] * d64[i, s] * e64[i, m]
  want = want.reshape(5, 12)
  np.testing.assert_allclose(layer(jnp.asarray(x, jnp.float32)), want, rtol=1e-5, atol=1e-6)
  with pytest.raises(ValueError, match="divisible"):
    MultiplicativeDense(10, 10, 3, rngs=nnx.Rngs(0))
