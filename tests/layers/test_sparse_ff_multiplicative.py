"""Scaling Transformers' SparseFF and multiplicative dense layer against float64 numpy.

The numpy references below follow Trax 1.4 `trax/layers/research/sparsity.py` (`SparseFF`,
`FactoredDense`) and the paper's Sec. 3.1-3.2; noise and the hard/soft draw are injected so
that the references see the same randomness as the layer.
"""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from float64_testing import float64_function, numpy_params
from jax.test_util import check_grads

from sparse_jax.layers import registry
from sparse_jax.layers.multiplicative_dense import MultiplicativeDense
from sparse_jax.layers.sparse_ff import SparseFF, first_max_index, straight_through
from sparse_jax.validation import ConfigError

D, D_FF, N, R = 12, 48, 8, 6
BLOCKS = D_FF // N
LEAD = (3, 5)  # batch, length


def make_sparse_ff(seed: int = 0, **kwargs) -> SparseFF:
  """A layer whose biases (c, b2 and b1 when present) are random and nonzero."""
  ff = SparseFF(D, D_FF, N, R, rngs=nnx.Rngs(seed), **kwargs)
  rng = np.random.default_rng(seed + 50)
  for bias in (ff.c_bias, ff.b_down, ff.b_up):
    if bias is not None:
      bias[...] = jnp.asarray(0.3 * rng.normal(size=bias.shape), jnp.float32)
  return ff


def random_inputs(seed: int):
  """x `[3, 5, D]` and Gumbel noise `[3, 5, blocks, N]`, float64 numpy."""
  rng = np.random.default_rng(seed)
  return rng.normal(size=(*LEAD, D)), rng.gumbel(size=(*LEAD, BLOCKS, N))


# --- numpy float64 references ------------------------------------------------------------

def np_softmax(z: np.ndarray) -> np.ndarray:
  e = np.exp(z - z.max(-1, keepdims=True))
  return e / e.sum(-1, keepdims=True)


def np_logits(p: dict, x: np.ndarray) -> np.ndarray:
  """`x C1 C2 + c` per block, `[..., blocks, N]`."""
  return ((x @ p["c_down"]) @ p["c_up"] + p["c_bias"]).reshape(*x.shape[:-1], BLOCKS, N)


def np_soft_and_hard(p, x, gumbel, *, temperature, soft_mask):
  """Trax: soft = softmax(clean logits); hard = one-hot argmax(logits + T * Gumbel).
  "noisy": soft = softmax(logits + T * Gumbel)."""
  logits = np_logits(p, x)
  noisy = logits + temperature * gumbel
  soft = np_softmax(noisy if soft_mask == "noisy" else logits)
  hard = np.eye(N)[np.argmax(noisy, -1)]
  return soft, hard


def np_forward(p: dict, x: np.ndarray, mask: np.ndarray, placement: str) -> np.ndarray:
  """`ReLU((x W1 + b1) * m) W2 + b2` (pre_relu) or `ReLU(x W1 + b1) * m W2 + b2` (post)."""
  a = x @ p["w_keys"].T + p.get("b_up", 0.0)
  h = np.maximum(a * mask, 0) if placement == "pre_relu" else np.maximum(a, 0) * mask
  return h @ p["w_values"] + p["b_down"]


def np_straight_through_grads(p, x, soft, hard, cot, placement):
  """Gradients of `sum(y * cot)` with the hard mask whose backward is the soft one."""
  m = hard.reshape(*LEAD, D_FF)
  a = x @ p["w_keys"].T + p.get("b_up", 0.0)
  dh = cot @ p["w_values"].T
  if placement == "pre_relu":  # d ReLU(a m): m-gradient a [a m > 0], a-gradient m [a m > 0]
    on = a * m > 0
    dm, da = dh * a * on, dh * m * on
  else:  # d ReLU(a) m: m-gradient ReLU(a), a-gradient m [a > 0]
    dm, da = dh * np.maximum(a, 0), dh * m * (a > 0)
  dm = dm.reshape(*LEAD, BLOCKS, N)
  dlogits = (soft * (dm - (soft * dm).sum(-1, keepdims=True))).reshape(*LEAD, D_FF)
  flat = lambda z: z.reshape(-1, z.shape[-1])  # noqa: E731
  return {"c_bias": flat(dlogits).sum(0),
          "c_up": flat(x @ p["c_down"]).T @ flat(dlogits),
          "w_keys": flat(da).T @ flat(x)}


# --- SparseFF ----------------------------------------------------------------------------

@pytest.mark.parametrize("up_bias,placement", [(False, "pre_relu"), (True, "post_relu")])
def test_eval_output_and_sparse_decode_match_numpy_float64(up_bias, placement):
  ff = make_sparse_ff(up_bias=up_bias, mask_placement=placement)
  ff.eval()
  p = numpy_params(ff)
  assert ("b_up" in p) == up_bias  # Trax has no b1; the paper has.
  x, _ = random_inputs(1)
  logits = np_logits(p, x)
  hard = np.eye(N)[np.argmax(logits, -1)].reshape(*LEAD, D_FF)
  want = np_forward(p, x, hard, placement)
  x32 = jnp.asarray(x, jnp.float32)
  np.testing.assert_array_equal(ff.mask(x32)[0], hard)
  np.testing.assert_allclose(ff(x32)[0], want, rtol=1e-4, atol=1e-5)
  np.testing.assert_allclose(ff.decode(x32), want, rtol=1e-4, atol=1e-5)
  np.testing.assert_allclose(ff.decode(x32[0, 0]), want[0, 0], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("soft_mask", ["clean", "noisy"])
def test_training_masks_match_numpy_with_injected_noise(soft_mask):
  # Temperature 2 so that the noise changes many choices: the test can tell the clean soft
  # mask from the noisy one and the noisy hard choice from the clean argmax.
  ff = make_sparse_ff(soft_mask=soft_mask, temperature=2.0)
  p = numpy_params(ff)
  x, gumbel = random_inputs(2)
  soft, hard = np_soft_and_hard(p, x, gumbel, temperature=2.0, soft_mask=soft_mask)
  assert np.mean(np.argmax(hard, -1) != np.argmax(np_logits(p, x), -1)) > 0.2
  x32, g32 = jnp.asarray(x, jnp.float32), jnp.asarray(gumbel, jnp.float32)
  got_soft, _ = ff.mask(x32, g32, jnp.asarray(False))
  got_hard, _ = ff.mask(x32, g32, jnp.asarray(True))
  np.testing.assert_allclose(got_soft, soft.reshape(*LEAD, D_FF), rtol=1e-4, atol=1e-6)
  np.testing.assert_allclose(got_hard, hard.reshape(*LEAD, D_FF), atol=1e-6)
  other = np_soft_and_hard(p, x, gumbel, temperature=2.0,
                           soft_mask="noisy" if soft_mask == "clean" else "clean")[0]
  assert np.abs(other - soft).max() > 1e-2


@pytest.mark.parametrize("placement", ["pre_relu", "post_relu"])
@pytest.mark.parametrize("use_hard", [False, True])
def test_training_forward_matches_numpy_with_injected_noise(placement, use_hard):
  ff = make_sparse_ff(mask_placement=placement, up_bias=True)
  p = numpy_params(ff)
  x, gumbel = random_inputs(3)
  soft, hard = np_soft_and_hard(p, x, gumbel, temperature=0.1, soft_mask="clean")
  want = np_forward(p, x, (hard if use_hard else soft).reshape(*LEAD, D_FF), placement)
  got, aux = ff(jnp.asarray(x, jnp.float32), gumbel=jnp.asarray(gumbel, jnp.float32),
                use_hard=jnp.asarray(use_hard))
  np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
  assert float(aux["reg_loss"]) == 0.0


@pytest.mark.parametrize("soft_mask,placement,up_bias", [("clean", "pre_relu", False),
                                                         ("noisy", "post_relu", True)])
def test_soft_mask_gradients_match_finite_differences_in_float64(soft_mask, placement, up_bias):
  """With the soft mask the layer is smooth: autodiff equals central differences."""
  ff = make_sparse_ff(soft_mask=soft_mask, mask_placement=placement, up_bias=up_bias)
  x, gumbel = random_inputs(4)
  x, gumbel = x[:1, :2], gumbel[:1, :2]  # two tokens: enough, and fast
  with jax.enable_x64(True):
    f, params = float64_function(
        ff, lambda layer, x: layer(x, gumbel=jnp.asarray(gumbel), use_hard=False)[0])
    x64 = jnp.asarray(x)
    assert f(params, x64).dtype == jnp.float64
    check_grads(f, (params, x64), order=1, modes=("rev",), eps=1e-6)


@pytest.mark.parametrize("placement", ["pre_relu", "post_relu"])
def test_hard_mask_gradients_are_the_straight_through_estimator(placement):
  """Forward one-hot, backward softmax: checked against the numpy chain rule. Before the
  ReLU (Trax) a unit that the hard mask zeroes sends no gradient to its mask entry."""
  ff = make_sparse_ff(mask_placement=placement)
  p = numpy_params(ff)
  x, gumbel = random_inputs(5)
  cot = np.random.default_rng(6).normal(size=(*LEAD, D))
  soft, hard = np_soft_and_hard(p, x, gumbel, temperature=0.1, soft_mask="clean")
  want = np_straight_through_grads(p, x, soft, hard, cot, placement)
  graphdef, params, rest = nnx.split(ff, nnx.Param, ...)

  def loss(params):
    layer = nnx.merge(graphdef, params, rest)
    y, _ = layer(jnp.asarray(x, jnp.float32), gumbel=jnp.asarray(gumbel, jnp.float32),
                 use_hard=jnp.asarray(True))
    return jnp.sum(y * jnp.asarray(cot, jnp.float32))

  grads = nnx.to_pure_dict(jax.grad(loss)(params))
  for name, value in want.items():
    np.testing.assert_allclose(grads[name], value, rtol=1e-4, atol=1e-5, err_msg=name)
  other = np_straight_through_grads(
      p, x, soft, hard, cot, "post_relu" if placement == "pre_relu" else "pre_relu")
  assert np.abs(other["c_bias"] - want["c_bias"]).max() > 1e-2  # the placements differ


@pytest.mark.parametrize("training", [True, False])
def test_replayed_choice_fixes_the_hard_units(training):
  """`replayable` returns the hard choice (the noisy argmax in training, the clean argmax in
  eval) and, given a different one back, uses it: the output is then the numpy forward with
  the replayed one-hot, whatever the noise says (a reversible network's recomputation)."""
  ff = make_sparse_ff()
  if not training:
    ff.eval()
  p = numpy_params(ff)
  x, gumbel = random_inputs(7)
  x32, g32 = jnp.asarray(x, jnp.float32), jnp.asarray(gumbel, jnp.float32)
  noisy = np_logits(p, x) + (0.1 * gumbel if training else 0.0)
  _, _, choice = ff.replayable(x32, gumbel=g32, use_hard=jnp.asarray(True))
  np.testing.assert_array_equal(choice, np.argmax(noisy, -1))
  replay = (np.asarray(choice) + 1 + np.arange(BLOCKS) % (N - 1)) % N  # every block moved
  y, _, echoed = ff.replayable(x32, jnp.asarray(replay, jnp.int32), gumbel=g32,
                               use_hard=jnp.asarray(True))
  np.testing.assert_array_equal(echoed, replay)
  want = np_forward(p, x, np.eye(N)[replay].reshape(*LEAD, D_FF), "pre_relu")
  np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_first_max_index_is_numpys_argmax_ties_included(dtype):
  """Against `np.argmax` (the first maximum wins), on values drawn from 4 levels so that most
  rows tie, on continuous values, and on one-unit blocks; a NaN row gives its last index."""
  rng = np.random.default_rng(3)
  for x in (rng.integers(0, 4, size=(6, 7, 9)).astype(np.float32),
            rng.normal(size=(5, 264, 16)).astype(np.float32),
            rng.normal(size=(4, 1)).astype(np.float32)):
    got = first_max_index(jnp.asarray(x, dtype))
    want = np.argmax(np.asarray(jnp.asarray(x, dtype), np.float64), axis=-1)
    assert got.dtype == jnp.int32
    np.testing.assert_array_equal(np.asarray(got), want)
  nan_row = jnp.asarray([[1.0, jnp.nan, 3.0], [2.0, 5.0, 5.0]], dtype)
  np.testing.assert_array_equal(np.asarray(first_max_index(nan_row)), [2, 1])


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


def test_drawn_masks_are_hard_with_quant_prob_one_and_clean_softmax_with_zero():
  """The layer's own draws: quant_prob 1 gives one-hots, 0 the softmax of the clean logits."""
  x = np.random.default_rng(4).normal(size=(6, D))
  x32 = jnp.asarray(x, jnp.float32)
  hard = np.asarray(make_sparse_ff(quant_prob=1.0).mask(x32)[0]).reshape(6, BLOCKS, N)
  np.testing.assert_allclose(hard.sum(-1), 1.0, rtol=1e-6)
  assert np.all(np.isin(np.round(hard, 5), [0.0, 1.0]))
  ff = make_sparse_ff(quant_prob=0.0)
  soft = np.asarray(ff.mask(x32)[0]).reshape(6, BLOCKS, N)
  np.testing.assert_allclose(soft, np_softmax(np_logits(numpy_params(ff), x)), rtol=1e-4,
                             atol=1e-6)


@pytest.mark.parametrize("up_bias", [False, True])
def test_sparse_ff_parameter_count_and_decode_flops(up_bias):
  ff = make_sparse_ff(up_bias=up_bias)
  assert sum(p.size for p in jax.tree.leaves(nnx.state(ff, nnx.Param))) == (
      2 * D * D_FF + D + D * R + R * D_FF + D_FF + (D_FF if up_bias else 0))
  assert ff.flops_per_token() == D * R + R * D_FF + 2 * D * (D_FF // N)


def assert_uniform(w: np.ndarray, limit: float) -> None:
  """U(-limit, limit): inside the bound, reaching near it, std limit / sqrt(3).

  With n >= 8192 draws, P(max |w| < 0.99 limit) = 0.99^n < 1e-35, and the sample std has a
  relative spread of sqrt(0.8 / (4 n)) < 0.5%, so 3% is over six of those."""
  assert w.size >= 8192
  assert np.abs(w).max() <= limit and np.abs(w).max() > 0.99 * limit
  np.testing.assert_allclose(w.std(), limit / np.sqrt(3), rtol=0.03)
  assert abs(w.mean()) < 4 * limit / np.sqrt(3 * w.size)


def assert_normal(w: np.ndarray, std: float) -> None:
  """N(0, std^2): the sample std's relative spread is 1 / sqrt(2 n) < 0.8% for n >= 8192,
  so 5% is over six of those; the mean is within 4 standard errors."""
  assert w.size >= 8192
  np.testing.assert_allclose(w.std(), std, rtol=0.05)
  assert abs(w.mean()) < 4 * std / np.sqrt(w.size)


def test_controller_init_is_glorot_uniform_by_default_and_normal_as_an_option():
  d, d_ff, n, r = 128, 2048, 32, 64
  glorot = SparseFF(d, d_ff, n, r, rngs=nnx.Rngs(0))
  assert_uniform(np.asarray(glorot.c_down[...]), np.sqrt(6 / (d + r)))
  assert_uniform(np.asarray(glorot.c_up[...]), np.sqrt(6 / (r + d_ff)))
  normal = SparseFF(d, d_ff, n, r, controller_init="normal", rngs=nnx.Rngs(0))
  assert_normal(np.asarray(normal.c_down[...]), d ** -0.5)
  assert_normal(np.asarray(normal.c_up[...]), r ** -0.5)
  for ff in (glorot, normal):
    assert not np.any(np.asarray(ff.c_bias[...])) and ff.b_up is None


def test_sparse_ff_config_fields_reach_the_layer_and_are_validated():
  base = {"kind": "sparse_ff", "d_ff": D_FF, "block_size": N}
  ff = registry.build_ff(base, d_model=D, n_layers=1, rngs=nnx.Rngs(0))
  assert (ff.soft_mask, ff.mask_placement, ff.b_up, ff.d_lowrank) == (
      "clean", "pre_relu", None, BLOCKS)
  paper = registry.build_ff({**base, "soft_mask": "noisy", "controller_init": "normal",
                             "up_bias": True, "mask_placement": "post_relu"},
                            d_model=D, n_layers=1, rngs=nnx.Rngs(0))
  assert (paper.soft_mask, paper.mask_placement, paper.b_up.shape) == (
      "noisy", "post_relu", (D_FF,))
  for field, bad, allowed in [("soft_mask", "gumbel", "one of ['clean', 'noisy']"),
                              ("controller_init", "xavier", "one of ['glorot', 'normal']"),
                              ("up_bias", "yes", "True or False"),
                              ("mask_placement", "after",
                               "one of ['pre_relu', 'post_relu']")]:
    with pytest.raises(ConfigError, match=re.escape(f"'model.ff.{field}' must be {allowed}")):
      registry.parse_ff({**base, field: bad})
  with pytest.raises(ValueError, match="'soft_mask' must be one of"):
    SparseFF(D, D_FF, N, R, soft_mask="gumbel", rngs=nnx.Rngs(0))


# --- the multiplicative layer ---------------------------------------------------------------

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


def np_multiplicative(p: dict, x: np.ndarray, s: int) -> np.ndarray:
  """`y[n, s M + m] = sum_i x[n, i] D[i, s] E[i, m] + b[s M + m]`, by explicit loops."""
  d_in, m_size = p["e_im"].shape
  y = np.zeros((len(x), s, m_size))
  for n, k, m, i in np.ndindex(len(x), s, m_size, d_in):
    y[n, k, m] += x[n, i] * p["d_is"][i, k] * p["e_im"][i, m]
  return y.reshape(len(x), s * m_size) + p.get("bias", 0.0)


@pytest.mark.parametrize("use_bias", [False, True])
def test_multiplicative_dense_matches_its_definition_in_float64(use_bias):
  layer = MultiplicativeDense(10, 12, 3, use_bias=use_bias, rngs=nnx.Rngs(1))
  if use_bias:
    layer.bias[...] = jnp.asarray(np.random.default_rng(2).normal(size=12), jnp.float32)
  p = numpy_params(layer)
  assert ("bias" in p) == use_bias and (not use_bias or p["bias"].shape == (12,))
  x = np.random.default_rng(1).normal(size=(5, 10))
  np.testing.assert_allclose(layer(jnp.asarray(x, jnp.float32)), np_multiplicative(p, x, 3),
                             rtol=1e-5, atol=1e-5)
  with jax.enable_x64(True):
    f, params = float64_function(layer, lambda module, x: module(x))
    check_grads(f, (params, jnp.asarray(x)), order=1, modes=("rev",), eps=1e-6)
  with pytest.raises(ValueError, match="divisible"):
    MultiplicativeDense(10, 10, 3, rngs=nnx.Rngs(0))


def test_multiplicative_init_is_trax_by_default_and_unit_as_an_option():
  """Trax `FactoredDense`: gating D ~ N(0, 0.5^2), E Glorot-uniform over `[d_in, M]`, zero
  bias of shape `[d_out]`; "unit": D ~ N(0, 1), E ~ N(0, 1/d_in)."""
  d_in, d_out, s = 512, 512, 16
  m = d_out // s
  trax = MultiplicativeDense(d_in, d_out, s, use_bias=True, rngs=nnx.Rngs(0))
  assert_normal(np.asarray(trax.d_is[...]), 0.5)
  assert_uniform(np.asarray(trax.e_im[...]), np.sqrt(6 / (d_in + m)))
  assert trax.bias.shape == (d_out,) and not np.any(np.asarray(trax.bias[...]))
  unit = MultiplicativeDense(d_in, d_out, s, init="unit", rngs=nnx.Rngs(0))
  assert_normal(np.asarray(unit.d_is[...]), 1.0)
  assert_normal(np.asarray(unit.e_im[...]), d_in ** -0.5)
  assert unit.bias is None
  with pytest.raises(ValueError, match="'init' must be one of"):
    MultiplicativeDense(d_in, d_out, s, init="glorot", rngs=nnx.Rngs(0))
