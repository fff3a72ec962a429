"""Reversible residual stacks (Scaling Transformers Sec. 4.2; RevNet, Gomez et al. 2017).

`reversible_stack`, which rebuilds activations backwards, against `sequential_stack`, plain
autodiff of the same function: equal outputs and gradients with the randomness and discrete
choices a sparse Terraformer block makes, replay shown to matter, finite differences,
activation memory flat in depth, and the NNX bridge under `nnx.value_and_grad`.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.test_util import check_grads

from sparse_jax.layers.reversible import (pure_half_residual, reversible_stack,
                                          sequential_stack)

B, T, D, U = 2, 8, 6, 4  # U gated units, one chosen per token (a sparse FF's block).
KEEP = 0.75  # Dropout keep probability of the toy half-residuals.


def gated_half(noise: float):
  """A toy sparse FF: `f(params, x, key, replay, valid_bt)`.

  Per token, one of U units is chosen by `argmax(x G + noise * Gumbel)` (the choice is
  recorded, or replayed), with a straight-through softmax so `G` gets a gradient; then
  dropout from `key`, padding masked by `valid_bt`, and a z-loss-like regulariser on the
  gate logits.
  """
  def f(params, x_btd, key, replay, valid_bt):
    gumbel_key, dropout_key = jax.random.split(key)
    logits_btu = x_btd @ params["gate"]
    if replay is None:
      noisy_btu = logits_btu + noise * jax.random.gumbel(gumbel_key, logits_btu.shape,
                                                          logits_btu.dtype)
      choice_bt = jnp.argmax(noisy_btu, axis=-1).astype(jnp.int32)
    else:
      choice_bt = replay
    soft_btu = jax.nn.softmax(logits_btu)
    mask_btu = (jax.nn.one_hot(choice_bt, U, dtype=x_btd.dtype) + soft_btu
                - jax.lax.stop_gradient(soft_btu))
    h_btu = jnp.tanh(x_btd @ params["w_in"]) * mask_btu
    h_btu = h_btu * jax.random.bernoulli(dropout_key, KEEP, h_btu.shape) / KEEP
    y_btd = (h_btu @ params["w_out"]) * valid_bt[..., None]
    loss = 1e-2 * jnp.mean(jax.nn.logsumexp(logits_btu, axis=-1) ** 2)
    return y_btd, loss.astype(jnp.float32), choice_bt
  return f


def gated_params(rng: np.random.Generator, dtype, out_scale: float = 1.0) -> dict:
  return {"gate": jnp.asarray(rng.normal(size=(D, U)), dtype),
          "w_in": jnp.asarray(rng.normal(size=(D, U)) / np.sqrt(D), dtype),
          "w_out": jnp.asarray(out_scale * rng.normal(size=(U, D)) / np.sqrt(U), dtype)}


def gated_problem(seed: int, n_layers: int, dtype):
  """`(fns, params_list, x1, x2, valid)`, all random; the last row's tail is padding."""
  rng = np.random.default_rng(seed)
  fns = (gated_half(noise=0.5),) * n_layers
  params_list = [gated_params(rng, dtype) for _ in range(n_layers)]
  x1, x2 = (jnp.asarray(rng.normal(size=(B, T, D)), dtype) for _ in range(2))
  valid_bt = jnp.ones((B, T), bool).at[-1, T - 2:].set(False)
  return fns, params_list, x1, x2, valid_bt


@functools.partial(jax.jit, static_argnums=(0, 1))
def value_and_grads(stack, fns, params_list, x1, x2, key, *context):
  """`((y1, y2, loss), grads wrt (params_list, x1, x2))` of a random linear readout."""
  readout = jax.random.normal(jax.random.key(99), x1.shape, x1.dtype)

  def objective(params_list, x1, x2):
    y1, y2, loss = stack(fns, params_list, x1, x2, key, *context)
    return jnp.sum(readout * y1) + jnp.sum(jnp.tanh(y2) ** 2) + 3.0 * loss, (y1, y2, loss)

  (_, outputs), grads = jax.value_and_grad(objective, argnums=(0, 1, 2), has_aux=True)(
      params_list, x1, x2)
  return outputs, grads


def assert_trees_close(actual, expected, rtol, atol):
  jax.tree.map(lambda a, e: np.testing.assert_allclose(a, e, rtol=rtol, atol=atol),
               actual, expected)


def test_reversible_equals_sequential_float64():
  """Dropout and Gumbel noise from the key, recorded choices, a loss term, a padding mask:
  in float64 rounding is far below the tolerance, so any difference would be a bug."""
  with jax.enable_x64(True):
    fns, params_list, x1, x2, valid_bt = gated_problem(0, n_layers=6, dtype=jnp.float64)
    key = jax.random.key(1)
    rev = value_and_grads(reversible_stack, fns, params_list, x1, x2, key, valid_bt)
    seq = value_and_grads(sequential_stack, fns, params_list, x1, x2, key, valid_bt)
    assert_trees_close(rev, seq, rtol=1e-11, atol=1e-12)
    assert all(np.abs(g).max() > 1e-3 for g in jax.tree.leaves(seq[1]))  # Every gradient flows.


def test_reversible_equals_sequential_float32():
  """Float32: each rebuilt `x1 = y2 - f(y1)` is off by about one rounding of the stream
  (|stream| <= 3.2, so ~2e-7), and earlier layers are recomputed from rebuilt inputs, so the
  errors add up over the 6 layers to ~1e-6, and the gradients (|g| ~ 1) inherit it (seen:
  2e-6 at most). Replayed choices cannot flip, so nothing is discontinuous. The tolerance
  (1e-5 + 1e-4 |g|) is 15x the largest error seen, relative to it elementwise."""
  fns, params_list, x1, x2, valid_bt = gated_problem(2, n_layers=6, dtype=jnp.float32)
  key = jax.random.key(3)
  rev = value_and_grads(reversible_stack, fns, params_list, x1, x2, key, valid_bt)
  seq = value_and_grads(sequential_stack, fns, params_list, x1, x2, key, valid_bt)
  assert_trees_close(rev[0], seq[0], rtol=1e-6, atol=1e-6)  # Same ops, fused differently.
  assert_trees_close(rev[1], seq[1], rtol=1e-4, atol=1e-5)


def tie_problem():
  """Two float32 half-residuals where recomputing the first one's choice flips it.

  f0's first two units have the stream's coordinates 0 and 1 as logits, set equal and
  positive (the other units' logits are 0): a tie, which argmax resolves to unit 0. f1's
  output is ~100x the streams, so rebuilding f0's input as `(b + f1(c)) - f1(c)` loses b's
  low bits, differently in the two coordinates: recomputed from it, the tie breaks at random
  (a quarter of the tokens flip).
  """
  rng = np.random.default_rng(5)
  tie_params = gated_params(rng, jnp.float32)
  tie_params["gate"] = jnp.eye(D, U, dtype=jnp.float32).at[:, 2:].set(0.0)
  loud_params = gated_params(rng, jnp.float32, out_scale=300.0)
  x1, x2 = (rng.normal(size=(B, 4 * T, D)).astype(np.float32) for _ in range(2))
  x2[..., 0] = x2[..., 1] = np.abs(x2[..., 0]) + 0.5  # Above the other units' logits, 0.
  valid_bt = jnp.ones((B, 4 * T), bool)
  return [tie_params, loud_params], jnp.asarray(x1), jnp.asarray(x2), valid_bt


def test_replay_keeps_choices_that_recomputation_flips():
  """Paper Sec. 4.2: the choice must be stored, not recomputed. The rebuilt input really
  flips recomputed choices; with replay the gradients still match plain autodiff, without
  it (a half-residual that ignores `replay`) they do not."""
  params_list, x1, x2, valid_bt = tie_problem()
  key = jax.random.key(7)
  f = gated_half(noise=0.0)

  _, record0 = f(params_list[0], x2, jax.random.fold_in(key, 0), None, valid_bt)[1:]
  c, d, _ = sequential_stack((f, f), params_list, x1, x2, key, valid_bt)
  f1_c = f(params_list[1], c, jax.random.fold_in(key, 1), None, valid_bt)[0]
  rebuilt_x2 = d - f1_c
  recomputed0 = f(params_list[0], rebuilt_x2, jax.random.fold_in(key, 0), None, valid_bt)[2]
  assert np.all(record0 == 0)
  np.testing.assert_allclose(rebuilt_x2, x2, atol=1e-4)
  assert np.mean(recomputed0 != record0) > 0.1

  def forgetful(params, x_btd, key, replay, valid_bt):
    del replay
    return f(params, x_btd, key, None, valid_bt)

  seq = value_and_grads(sequential_stack, (f, f), params_list, x1, x2, key, valid_bt)[1]
  rev = value_and_grads(reversible_stack, (f, f), params_list, x1, x2, key, valid_bt)[1]
  unreplayed = value_and_grads(reversible_stack, (forgetful, f), params_list, x1, x2, key,
                               valid_bt)[1]
  # Gradients reach ~150 (f1 is loud) and inputs are rebuilt to ~1e-5: errors up to ~4e-4.
  assert_trees_close(rev, seq, rtol=1e-3, atol=1e-3)
  w_in_error = np.abs(unreplayed[0][0]["w_in"] - seq[0][0]["w_in"]).max()
  assert w_in_error > 0.1 * np.abs(seq[0][0]["w_in"]).max()  # Seen: 0.8 of it.


def smooth_half(params, x_btd, key, replay):
  """`Dropout(tanh(x W)) V`, plus a loss on the activations: smooth in params and x."""
  del replay
  h_btd = jnp.tanh(x_btd @ params["w"])
  h_btd = h_btd * jax.random.bernoulli(key, KEEP, h_btd.shape) / KEEP
  return h_btd @ params["v"], 0.1 * jnp.mean(h_btd ** 2), ()


def test_finite_differences_float64():
  """The custom VJP against numerical differences of the forward (a raw uint32 key)."""
  with jax.enable_x64(True):
    rng = np.random.default_rng(11)
    params_list = [{"w": jnp.asarray(rng.normal(size=(D, D)) / np.sqrt(D)),
                    "v": jnp.asarray(rng.normal(size=(D, D)) / np.sqrt(D))} for _ in range(3)]
    x1, x2 = (jnp.asarray(rng.normal(size=(B, T, D))) for _ in range(2))
    key = jax.random.PRNGKey(13)

    def stack(params_list, x1, x2):
      return reversible_stack((smooth_half,) * 3, params_list, x1, x2, key)

    check_grads(stack, (params_list, x1, x2), order=1, modes=("rev",), atol=1e-6, rtol=1e-6)


def dense_half(w_dd, x_btd, key, replay):
  del key, replay
  return jnp.tanh(x_btd @ w_dd), jnp.zeros((), jnp.float32), ()


def step_temp_bytes(stack, n_layers: int, b: int = 4, t: int = 256, d: int = 64) -> int:
  """XLA's temporary buffer bytes (outside arguments and outputs) of a jitted training step
  of `n_layers` dense half-residuals: loss = mean of the outputs squared."""
  def loss(ws, x_btd):
    y1, y2, aux = stack((dense_half,) * n_layers, ws, x_btd, x_btd, jax.random.key(0))
    return jnp.mean(y1 ** 2) + jnp.mean(y2 ** 2) + aux

  ws = [jax.ShapeDtypeStruct((d, d), jnp.float32)] * n_layers
  x = jax.ShapeDtypeStruct((b, t, d), jnp.float32)
  step = jax.jit(jax.grad(loss, argnums=(0, 1)))
  return step.lower(ws, x).compile().memory_analysis().temp_size_in_bytes


def test_activation_memory_flat_in_depth():
  """One activation [4, 256, 64] f32 is 256 KiB. Storing them grows the step's temporaries
  with depth; recomputing keeps them at a few activations whatever the depth."""
  rev4, rev24 = step_temp_bytes(reversible_stack, 4), step_temp_bytes(reversible_stack, 24)
  seq4, seq24 = step_temp_bytes(sequential_stack, 4), step_temp_bytes(sequential_stack, 24)
  assert rev24 < 1.5 * rev4, (rev4, rev24)
  assert seq24 > 3 * seq4, (seq4, seq24)
  assert rev24 < seq24 / 3, (rev24, seq24)


class NoisyHalf(nnx.Module):
  """`y = Dropout(tanh(Linear x)) + 0.1 * noise` masked by `valid`; randomness from an
  nnx.Dropout stream and a `fork()`ed stream; loss: an L2 term on the kernel."""

  def __init__(self, d: int, *, rngs: nnx.Rngs):
    self.linear = nnx.Linear(d, d, param_dtype=jnp.float64, rngs=rngs)
    self.dropout = nnx.Dropout(0.5, rngs=rngs)
    self.noise = rngs["dropout"].fork()

  def __call__(self, x_btd, valid_bt, *, replay=None):
    del replay
    y_btd = self.dropout(jnp.tanh(self.linear(x_btd)))
    y_btd = y_btd + 0.1 * jax.random.normal(self.noise(), x_btd.shape, x_btd.dtype)
    return y_btd * valid_bt[..., None], 1e-2 * jnp.mean(self.linear.kernel[...] ** 2), ()


class TwoStreamModel(nnx.Module):
  """Halves run as one stack, streams averaged: how a Terraformer uses the bridge."""

  def __init__(self, d: int, n_layers: int, reversible: bool, *, rngs: nnx.Rngs):
    self.halves = nnx.List([NoisyHalf(d, rngs=rngs) for _ in range(n_layers)])
    self.readout = nnx.Linear(d, 1, param_dtype=jnp.float64, rngs=rngs)
    self.reversible = reversible

  def __call__(self, x_btd, valid_bt, key):
    fns, states = zip(*(pure_half_residual(half) for half in self.halves))
    stack = reversible_stack if self.reversible else sequential_stack
    y1, y2, loss = stack(fns, states, x_btd, x_btd, key, valid_bt)
    return jnp.mean(self.readout((y1 + y2) / 2) ** 2) + loss


def test_nnx_bridge_gradients_and_randomness():
  """`nnx.value_and_grad` through the bridge gives the sublayers' Params the gradients of
  plain autodiff (dropout rate 0.5: a mask redrawn differently would change them); all
  randomness comes from the key; the outer model's RNG streams are not advanced."""
  with jax.enable_x64(True):
    rng = np.random.default_rng(17)
    x_btd = jnp.asarray(rng.normal(size=(B, T, D)))
    valid_bt = jnp.ones((B, T), bool).at[0, -3:].set(False)
    key = jax.random.key(19)
    models = [TwoStreamModel(D, 3, reversible, rngs=nnx.Rngs(params=0, dropout=1))
              for reversible in (True, False)]
    counts_before = nnx.to_pure_dict(nnx.state(models[0], nnx.RngCount))
    (rev_loss, rev_grads), (seq_loss, seq_grads) = (
        nnx.value_and_grad(lambda m: m(x_btd, valid_bt, key))(model) for model in models)
    np.testing.assert_allclose(rev_loss, seq_loss, rtol=1e-13)
    assert_trees_close(nnx.to_pure_dict(rev_grads), nnx.to_pure_dict(seq_grads),
                       rtol=1e-10, atol=1e-12)
    assert all(np.abs(g).max() > 1e-4 for g in jax.tree.leaves(nnx.to_pure_dict(
        rev_grads["halves"])))
    assert jax.tree.map(int, nnx.to_pure_dict(nnx.state(models[0], nnx.RngCount))) == (
        jax.tree.map(int, counts_before))

    half = models[0].halves[0]
    other_seeds = nnx.clone(half)
    nnx.reseed(other_seeds, dropout=123)
    f, state = pure_half_residual(half)
    g, other_state = pure_half_residual(other_seeds)
    assert f == g and hash(f) == hash(g)  # Static: same graph, same function.
    y_btd = f(state, x_btd, key, None, valid_bt)[0]
    np.testing.assert_array_equal(g(other_state, x_btd, key, None, valid_bt)[0], y_btd)
    assert not np.allclose(f(state, x_btd, jax.random.key(20), None, valid_bt)[0], y_btd)


def test_float_record_is_rejected():
  """A record holds choices; a float array in it would be a stored activation."""
  def leaky(params, x_btd, key, replay):
    del key, replay
    return x_btd * params, jnp.zeros((), jnp.float32), x_btd

  x = jnp.ones((B, T, D))
  with pytest.raises(TypeError, match="integer choices"):
    reversible_stack((leaky,), [jnp.ones(())], x, x, jax.random.key(0))
