"""Terraformer's fixed-base positional encoding against a float64 numpy port of Trax 1.4
`FixedBasePositionalEncoding` (`trax/layers/research/position_encodings.py`).

The port follows Trax's loop: for each base, repeatedly take `position mod base` and divide,
multiply each digit by its learned vector, concatenate the digits, optionally zero the row
(base dropout, the same mask for every base), sum the bases, then add `start_vec` at the
first position. The training draws are checked through their distribution, read back from
the layer's output with "reader" weights that spell the position out in base 11.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from float64_testing import float64_function, numpy_params
from jax.test_util import check_grads

from sparse_jax import parallel
from sparse_jax.layers.counting import count_params
from sparse_jax.layers.fixed_base_positions import FixedBasePositions

BASES = (11, 13, 14, 15)
N_DIGITS = 8
MAX_POS = 11**8
D = 16  # two channels per digit
B, T = 8, 6

# Compiled once per shape and layer structure, shared by the tests (eager dispatch of every
# small op compiles it separately, which is slower).
CALL = nnx.jit(lambda m, x: m(x))
EMBED = nnx.jit(lambda m, pos, first, keep: m.embed(pos, first, keep))
DECODE = nnx.jit(lambda m, x, pos: m.decode(x, pos))


def np_encoding(w: np.ndarray, start_vec: np.ndarray, positions_bt: np.ndarray,
                first_bt: np.ndarray, keep_b: np.ndarray | None = None,
                bases=BASES) -> np.ndarray:
  """`[B, T, d]` float64: Trax's formula, written base by base and digit by digit."""
  positions_bt = np.asarray(positions_bt, np.int64)
  total = 0.0
  for bn, base in enumerate(bases):
    rest, parts = positions_bt, []
    for i in range(w.shape[1]):
      parts.append((rest % base)[:, :, None].astype(np.float64) * w[bn, i])
      rest = rest // base
    emb = np.concatenate(parts, axis=-1)
    if keep_b is not None:
      emb = emb * np.asarray(keep_b, np.float64)[:, None, None]
    total = total + emb
  return total + np.where(np.asarray(first_bt)[..., None], start_vec, 0.0)


def np_weights(p: dict) -> np.ndarray:
  """`[n_bases, n_digits, d_digit]` float64 from the per-base `[d]` vectors of `numpy_params`
  (digit i is slice i, as Trax concatenates)."""
  w = np.stack([p["digit_weights"][k] for k in range(len(p["digit_weights"]))])
  return w.reshape(w.shape[0], N_DIGITS, -1)


def make_layer(seed: int = 0, d_model: int = D, **kwargs) -> FixedBasePositions:
  """A layer with random N(0, 1) weights (not the tiny init), every base different."""
  layer = FixedBasePositions(d_model, rngs=nnx.Rngs(seed), **kwargs)
  rng = np.random.default_rng(seed + 50)
  for param in layer.digit_weights:
    param[...] = jnp.asarray(rng.normal(size=param.shape), jnp.float32)
  layer.start_vec[...] = jnp.asarray(rng.normal(size=layer.start_vec.shape), jnp.float32)
  return layer


def set_reader_weights(layer: FixedBasePositions, start_value: float = 0.5) -> None:
  """Base 11's digit vectors all ones, the other bases zero, `start_vec` = `start_value`:
  the encoding of p is then its base-11 digits (each repeated d/8 times)."""
  for k, param in enumerate(layer.digit_weights):
    param[...] = jnp.full(param.shape, 1.0 if k == 0 else 0.0, jnp.float32)
  layer.start_vec[...] = jnp.full(layer.start_vec.shape, start_value, jnp.float32)


def read_positions(enc_bd: np.ndarray) -> np.ndarray:
  """Positions `[B]` from reader-weight encodings without `start_vec` `[B, d]`."""
  d_digit = enc_bd.shape[-1] // N_DIGITS
  digits = enc_bd[:, ::d_digit]
  np.testing.assert_array_equal(digits, np.round(digits))
  assert digits.min() >= 0 and digits.max() <= 10
  return (np.round(digits).astype(np.int64) * 11 ** np.arange(N_DIGITS)).sum(-1)


def test_the_port_and_the_reader_weights_spell_out_positions():
  """The port itself: with reader weights a position reads back as itself."""
  w = np.zeros((4, N_DIGITS, 1))
  w[0] = 1.0
  positions = np.array([[0, 1, 10, 11, 121, 12345, MAX_POS - 1]])
  enc = np_encoding(w, np.zeros(N_DIGITS), positions, np.zeros_like(positions, bool))
  np.testing.assert_array_equal(read_positions(enc[0]), positions[0])
  np.testing.assert_array_equal(enc[0, 3], [0, 1, 0, 0, 0, 0, 0, 0])  # 11 = "10" in base 11


def test_embed_matches_the_port_at_small_and_large_offsets():
  layer = make_layer(1)
  p = numpy_params(layer)
  starts = np.array([0, 1, 7, 12345, 3 * 10**7, MAX_POS // 2, MAX_POS - 6, MAX_POS - 7])
  positions = starts[:, None] + np.arange(6)
  first = np.random.default_rng(2).random(positions.shape) < 0.3
  keep = np.array([1, 1, 0, 1, 1, 0, 1, 1], bool)
  got = EMBED(layer, jnp.asarray(positions, jnp.int32), jnp.asarray(first), jnp.asarray(keep))
  assert got.shape == (B, T, D) and got.dtype == jnp.float32
  want = np_encoding(np_weights(p), p["start_vec"], positions, first, keep)
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)
  # Default first_bt: start_vec where the position is 0.
  got = layer.embed(jnp.asarray(positions, jnp.int32))
  want = np_encoding(np_weights(p), p["start_vec"], positions, positions == 0)
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)


def test_eval_call_is_x_plus_the_port_from_zero_and_draws_nothing():
  layer = make_layer(3)
  layer.eval()
  assert layer.deterministic
  p = numpy_params(layer)
  x = np.random.default_rng(4).normal(size=(B, T, D)).astype(np.float32)
  positions = np.broadcast_to(np.arange(T), (B, T))
  want = x + np_encoding(np_weights(p), p["start_vec"], positions, positions == 0)
  np.testing.assert_allclose(CALL(layer, jnp.asarray(x)), want, rtol=1e-5, atol=1e-4)
  np.testing.assert_allclose(layer(jnp.asarray(x)), want, rtol=1e-5, atol=1e-4)  # eager
  start, keep = layer.draw_starts(B, T)
  assert not np.any(start) and np.all(keep)
  # Under nnx.jit too, and the output keeps the input's dtype.
  y = CALL(layer, jnp.asarray(x, jnp.bfloat16))
  assert y.dtype == jnp.bfloat16
  np.testing.assert_allclose(np.asarray(y, np.float32), want, rtol=0.02, atol=0.1)


def test_model_train_and_eval_toggle_the_layer():
  class Wrapper(nnx.Module):
    def __init__(self, rngs):
      self.pos = FixedBasePositions(D, rngs=rngs)

  model = Wrapper(nnx.Rngs(0))
  assert not model.pos.deterministic
  model.eval()
  assert model.pos.deterministic
  model.train()
  assert not model.pos.deterministic
  assert FixedBasePositions(D, deterministic=True, rngs=nnx.Rngs(0)).deterministic


def test_each_training_row_is_the_port_at_its_drawn_offset():
  """Training: the offsets are read back from a copy with reader weights drawing the same
  randomness; the layer with random weights then matches the port at those offsets."""
  b, t = 48, 5
  layer = make_layer(5)
  reader = nnx.clone(layer)
  set_reader_weights(reader, 0.5)
  helper = nnx.clone(layer)
  x = np.random.default_rng(6).normal(size=(b, t, D)).astype(np.float32)

  enc = np.asarray(CALL(reader, jnp.zeros((b, t, D))), np.float64)
  kept = np.any(enc[:, 1] != 0, axis=-1)
  starts = np.where(kept, read_positions(enc[:, 0] - 0.5), 0)
  assert 0 < np.count_nonzero(starts) < b  # some rows start at 0, some elsewhere
  for k in range(1, t):  # consecutive positions within a kept row
    np.testing.assert_array_equal(read_positions(enc[kept, k]), starts[kept] + k)
  np.testing.assert_array_equal(enc[~kept, 1:], 0.0)
  np.testing.assert_array_equal(enc[:, 0][~kept], 0.5)

  p = numpy_params(layer)
  positions = starts[:, None] + np.arange(t)
  want = x + np_encoding(np_weights(p), p["start_vec"], positions,
                         np.arange(t)[None].repeat(b, 0) == 0, kept)
  np.testing.assert_allclose(CALL(layer, jnp.asarray(x)), want, rtol=1e-5, atol=1e-4)

  # draw_starts draws exactly what __call__ used.
  start, keep = helper.draw_starts(b, t)
  np.testing.assert_array_equal(keep, kept)
  np.testing.assert_array_equal(np.where(keep, start, 0), starts)
  # The stream advances: the next call draws other starts.
  start2, _ = helper.draw_starts(b, t)
  assert np.any(start2 != start)


def test_training_draw_rates():
  """Over many rows: half start at 0, the other starts are uniform in [0, max_pos - T), and
  1 row in 100 loses its position embedding (start_vec still added)."""
  n, t = 20000, 2
  layer = FixedBasePositions(N_DIGITS, rngs=nnx.Rngs(7))
  set_reader_weights(layer, 0.5)
  enc = np.asarray(CALL(layer, jnp.zeros((n, t, N_DIGITS))), np.float64)
  kept = np.any(enc[:, 1] != 0, axis=-1)  # position p + 1 >= 1 has a nonzero digit
  np.testing.assert_array_equal(enc[~kept, 0], 0.5)
  dropped = 1 - kept.mean()
  assert abs(dropped - 0.01) < 4 * np.sqrt(0.01 * 0.99 / n), dropped
  starts = read_positions(enc[kept, 0] - 0.5)
  np.testing.assert_array_equal(read_positions(enc[kept, 1]), starts + 1)
  zero = (starts == 0).mean()
  assert abs(zero - 0.5) < 4 * np.sqrt(0.25 / kept.sum()), zero
  nonzero = starts[starts > 0].astype(np.float64)
  m = MAX_POS - t  # uniform over [0, m)
  assert nonzero.max() < m and nonzero.max() > 0.995 * m and nonzero.min() < 0.005 * m
  assert abs(nonzero.mean() - (m - 1) / 2) < 4 * m / np.sqrt(12 * nonzero.size)
  for q in (0.1, 0.25, 0.5, 0.75, 0.9):
    assert abs((nonzero < q * m).mean() - q) < 4 * np.sqrt(q * (1 - q) / nonzero.size)
  # The two draws are independent: dropout hits rows starting at 0 and elsewhere alike.
  # (Dropped rows' starts cannot be read back, so check it through the helper.)
  start, keep = nnx.clone(layer).draw_starts(n, t)
  start, keep = np.asarray(start), np.asarray(keep)
  for rows in (start == 0, start > 0):
    rate = 1 - keep[rows].mean()
    assert abs(rate - 0.01) < 4 * np.sqrt(0.01 * 0.99 / rows.sum()), rate


def test_init_is_tiny_uniform_and_identical_across_bases():
  layer = FixedBasePositions(64, rngs=nnx.Rngs(8))
  assert len(layer.digit_weights) == 4
  assert all(param.shape == (64,) for param in layer.digit_weights)
  w, s = np.asarray(layer.weights_knd()), np.asarray(layer.start_vec[...])
  assert w.shape == (4, N_DIGITS, 8) and s.shape == (64,)
  assert w.dtype == np.float32 and s.dtype == np.float32
  for a in (w, s):
    assert np.abs(a).max() <= 1e-4 and np.abs(a).max() > 0.5e-4 and np.all(a != 0)
    assert abs(a.mean()) < 3e-5  # centred (uniform: std 5.8e-5 / sqrt(size))
  for bn in range(1, 4):  # Trax reuses one list of per-digit keys for every base
    np.testing.assert_array_equal(w[bn], w[0])
  assert len(np.unique(w[0])) == w[0].size  # but digits and start_vec differ
  assert not np.any(np.isin(s, w[0]))
  layer2 = FixedBasePositions(64, init_limit=0.5, rngs=nnx.Rngs(8))
  assert np.abs(np.asarray(layer2.weights_knd())).max() > 0.4
  # Parameters, their logical axes and count.
  for param in jax.tree.leaves(nnx.state(layer, nnx.Param),
                               is_leaf=lambda v: isinstance(v, nnx.Variable)):
    axes = parallel.declared_axes(param)
    assert len(axes) == param.ndim
    assert set(axes) <= set(parallel.LOGICAL_AXES)
  assert count_params(layer) == 4 * 64 + 64


def test_errors():
  with pytest.raises(ValueError, match=r"d_model \(12\).*n_digits \(8\)"):
    FixedBasePositions(12, rngs=nnx.Rngs(0))
  FixedBasePositions(12, n_digits=3, rngs=nnx.Rngs(0))
  with pytest.raises(ValueError, match="int32"):
    FixedBasePositions(16, bases=(16, 17), rngs=nnx.Rngs(0))
  small = FixedBasePositions(4, bases=(2, 3), n_digits=2, rngs=nnx.Rngs(0))  # max_pos 4
  assert small.max_pos == 4
  assert CALL(small, jnp.zeros((2, 3, 4))).shape == (2, 3, 4)
  with pytest.raises(ValueError, match="max_pos"):
    CALL(small, jnp.zeros((2, 4, 4)))
  small.eval()
  with pytest.raises(ValueError, match="max_pos"):
    small(jnp.zeros((2, 4, 4)))
  with pytest.raises(ValueError, match="max_pos"):
    small.decode(jnp.zeros((2, 4, 4)), 0)
  with pytest.raises(ValueError, match="batch, length, 4"):
    small(jnp.zeros((2, 3, 8)))


def test_decode_follows_trax_predict_and_matches_eval_step_by_step():
  """Trax `predict`: positions continue from a counter, start_vec only at position 0.
  Decoding one token at a time from 0 equals the eval call on the whole sequence."""
  layer = make_layer(9)
  p = numpy_params(layer)
  b, t = B, T
  x = jnp.asarray(np.random.default_rng(10).normal(size=(b, t, D)), jnp.float32)
  got = np.concatenate([DECODE(layer, x[:, k:k + 1], k) for k in range(t)], axis=1)
  layer.eval()
  np.testing.assert_allclose(got, CALL(layer, x), rtol=1e-6, atol=1e-5)
  # Chunks at per-row counters, some large: start_vec only in the row whose counter is 0.
  pos = np.array([MAX_POS - 10, 3, 0, 1, 5, 100, 11**7, MAX_POS // 3])
  positions = pos[:, None] + np.arange(t)
  want = np.asarray(x) + np_encoding(np_weights(p), p["start_vec"], positions,
                                     positions == 0)
  assert (positions == 0).sum() == 1
  np.testing.assert_allclose(DECODE(layer, x, jnp.asarray(pos)), want, rtol=1e-5, atol=1e-4)
  want = np.asarray(x) + np_encoding(np_weights(p), p["start_vec"],
                                     np.broadcast_to(np.arange(t), (b, t)) + 0,
                                     np.eye(1, t, dtype=bool).repeat(b, 0))
  np.testing.assert_allclose(DECODE(layer, x, 0), want, rtol=1e-5, atol=1e-4)


def test_gradients_flow_to_the_weights():
  """Finite differences in float64, and the analytic gradient of <g, encoding>: digit i of
  base b times g's block i, summed over rows and positions; start_vec: g at the first
  positions."""
  layer = make_layer(11)
  b, t = 3, 4
  positions = np.array([0, 100, MAX_POS - 5])[:, None] + np.arange(t)
  first = np.arange(t)[None].repeat(b, 0) == 0
  keep = np.array([1.0, 0.0, 1.0])
  with jax.enable_x64(True):
    f, params = float64_function(
        layer, lambda m, pos: m.embed(pos, jnp.asarray(first), jnp.asarray(keep)))
    pos = jnp.asarray(positions, jnp.int32)
    check_grads(lambda prm: f(prm, pos), (params,), order=1, modes=("rev",), eps=1e-6)

  g = np.random.default_rng(12).normal(size=(b, t, D))
  grads = nnx.jit(nnx.grad(lambda m: jnp.sum(m.embed(jnp.asarray(positions, jnp.int32),
                                                     jnp.asarray(first), jnp.asarray(keep))
                                             * jnp.asarray(g, jnp.float32))))(layer)
  want_w = np.zeros((4, N_DIGITS, D // N_DIGITS))
  g_blocks = g.reshape(b, t, N_DIGITS, D // N_DIGITS) * keep[:, None, None, None]
  for bn, base in enumerate(BASES):
    for i in range(N_DIGITS):
      digit = (positions // base**i) % base
      want_w[bn, i] = np.einsum("bt,btd->d", digit, g_blocks[:, :, i])
  got_w = np.stack([grads["digit_weights"][k][...] for k in range(4)])
  np.testing.assert_allclose(got_w, want_w.reshape(4, D), rtol=1e-5, atol=1e-4)
  np.testing.assert_allclose(grads["start_vec"][...], g[:, 0].sum(0), rtol=1e-5, atol=1e-5)

  # Through the training call too (random starts): x gets the identity, the weights and
  # start_vec theirs.
  layer.train()
  x = jnp.asarray(np.random.default_rng(13).normal(size=(b, t, D)), jnp.float32)
  g32 = jnp.asarray(g, jnp.float32)
  gm, gx = nnx.jit(nnx.grad(lambda m, x: jnp.sum(m(x) * g32), argnums=(0, 1)))(layer, x)
  np.testing.assert_allclose(gx, g, rtol=1e-6)
  assert all(np.abs(np.asarray(gm["digit_weights"][k][...])).sum() > 0 for k in range(4))
  np.testing.assert_allclose(gm["start_vec"][...], g[:, 0].sum(0), rtol=1e-5, atol=1e-5)
