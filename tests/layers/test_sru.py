"""The low-rank SRU branch against a float64 numpy loop (Scaling Transformers Sec. 4.3).

The reference steps the SRU of Trax 1.4 `trax/layers/rnn.py` one token at a time: gates
(r, f, y) from one dense layer on the low-rank input u, `c_t = f c_{t-1} + (1 - f) y`,
`h_t = r c_t + (1 - r) u sqrt(3)`, between the down and up projections.
"""

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from float64_testing import float64_function, numpy_params
from jax.test_util import check_grads

from sparse_jax import parallel
from sparse_jax.layers.counting import count_params
from sparse_jax.layers.sru import LowRankSRU

D, R = 10, 4
B, T = 2, 7


def make_sru(seed: int = 0, forget_bias: float = 0.0) -> LowRankSRU:
  """A branch with every parameter random (biases nonzero); `forget_bias` shifts the forget
  gate's pre-activation, towards long memory when positive."""
  sru = LowRankSRU(D, R, n_layers=2, rngs=nnx.Rngs(seed))
  rng = np.random.default_rng(seed + 100)
  for param in (sru.w_down, sru.w_gates, sru.w_up):
    param[...] = jnp.asarray(0.7 * rng.normal(size=param.shape) / np.sqrt(param.shape[0]),
                             jnp.float32)
  for param in (sru.b_down, sru.b_gates, sru.b_up):
    param[...] = jnp.asarray(0.3 * rng.normal(size=param.shape), jnp.float32)
  sru.b_gates[R:2 * R] += forget_bias
  return sru


def random_x(seed: int, length: int = T) -> np.ndarray:
  return np.random.default_rng(seed).normal(size=(B, length, D))


def np_sigmoid(z: np.ndarray) -> np.ndarray:
  return 1.0 / (1.0 + np.exp(-z))


def np_branch(p: dict, x_btd: np.ndarray, c0_br: np.ndarray | None = None):
  """`(y [B, T, D], c_last [B, R])`, one token at a time, in float64."""
  c = np.zeros((x_btd.shape[0], R)) if c0_br is None else c0_br
  outputs = []
  for t in range(x_btd.shape[1]):
    u = x_btd[:, t] @ p["w_down"] + p["b_down"]
    gates = u @ p["w_gates"] + p["b_gates"]
    r, f, y = np_sigmoid(gates[:, :R]), np_sigmoid(gates[:, R:2 * R]), gates[:, 2 * R:]
    c = f * c + (1.0 - f) * y
    h = r * c + (1.0 - r) * u * np.sqrt(3.0)
    outputs.append(h @ p["w_up"] + p["b_up"])
  return np.stack(outputs, axis=1), c


def test_forward_matches_the_float64_loop():
  sru = make_sru()
  x = random_x(1)
  with jax.enable_x64(True):
    f, params = float64_function(sru, lambda layer, x: layer(x))
    y = f(params, jnp.asarray(x))
  assert y.dtype == jnp.float64 and y.shape == (B, T, D)
  want, _ = np_branch(numpy_params(sru), x)
  np.testing.assert_allclose(np.asarray(y), want, rtol=1e-12, atol=1e-12)


def test_forward_from_a_carry_continues_the_sequence():
  """Two chunks through `forward`, the carry passed along, equal one pass; the final carry is
  the reference's last state."""
  sru = make_sru(1)
  x = random_x(2)
  c0 = np.random.default_rng(3).normal(size=(B, R))
  with jax.enable_x64(True):
    f, params = float64_function(sru, lambda layer, x, c: layer.forward(x, c))
    y1, c1 = f(params, jnp.asarray(x[:, :3]), jnp.asarray(c0))
    y2, c2 = f(params, jnp.asarray(x[:, 3:]), c1)
  want_y, want_c = np_branch(numpy_params(sru), x, c0)
  np.testing.assert_allclose(np.concatenate([y1, y2], axis=1), want_y, rtol=1e-12, atol=1e-12)
  np.testing.assert_allclose(np.asarray(c2), want_c, rtol=1e-12, atol=1e-12)


def test_decode_token_by_token_equals_the_full_forward():
  sru = make_sru(2)
  x = jnp.asarray(random_x(4), jnp.float32)
  full = sru(x)
  step = nnx.jit(lambda layer, x_b1d, carry: layer.decode(x_b1d, carry))
  carry = sru.init_cache(B, jnp.float32)
  assert carry.shape == (B, R) and carry.dtype == jnp.float32
  tokens = []
  for t in range(T):
    y_b1d, carry = step(sru, x[:, t:t + 1], carry)
    tokens.append(y_b1d)
  np.testing.assert_allclose(np.concatenate(tokens, axis=1), full, rtol=1e-5, atol=1e-5)


def test_bfloat16_input_keeps_a_float32_cell():
  """The output has the input's dtype; the carry stays float32 (module docstring)."""
  sru = make_sru(3)
  x = jnp.asarray(random_x(5), jnp.bfloat16)
  y, carry = sru.forward(x, sru.init_cache(B, jnp.bfloat16))
  assert y.dtype == jnp.bfloat16 and carry.dtype == jnp.float32
  np.testing.assert_allclose(np.asarray(y, np.float32), sru(x.astype(jnp.float32)),
                             rtol=0.05, atol=0.05)


def test_gradients_match_finite_differences_in_float64():
  sru = make_sru(4)
  x = random_x(6, length=5)
  with jax.enable_x64(True):
    f, params = float64_function(sru, lambda layer, x: layer(x))
    check_grads(f, (params, jnp.asarray(x)), order=1, modes=("rev",), eps=1e-6)


def test_long_sequence_stays_finite_and_matches_the_loop():
  """T = 1000 with forget gates near 1 (long memory): the float32 scan stays finite and
  matches the float64 loop."""
  sru = make_sru(5, forget_bias=4.0)
  x = random_x(7, length=1000)
  y = np.asarray(jax.jit(lambda x: sru(x))(jnp.asarray(x, jnp.float32)))
  assert np.isfinite(y).all()
  want, _ = np_branch(numpy_params(sru), x)
  np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-4)


def test_parameters_declare_known_axes_and_are_counted():
  sru = make_sru()
  params = nnx.state(sru, nnx.Param)
  for _, param in nnx.to_flat_state(params):
    axes = parallel.declared_axes(param)
    assert len(axes) == param.ndim and set(axes) <= set(parallel.LOGICAL_AXES)
  assert count_params(sru) == D * R + R + R * 3 * R + 3 * R + R * D + D
  assert sru.flops_per_token() == D * R + 3 * R * R + R * D
