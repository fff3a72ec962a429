"""SwitchHead with Transformer-XL relative positions against a float64 numpy reference of its
equations, looped over batch, heads, queries and visible keys (values and gradients).

Written from the authors' `FullMoeRelativeAttention` as `SwitchHeadXLAttention`'s docstring
states it: score(i, j) = (q_i . k_j + q_i . P(j - M - i) W_pos[h]) / sqrt(Dh), P the
interleaved sin/cos of the signed offset, keys and the V router over the whole context.
Float32 tolerances as in tests/layers/test_switchhead_attention.py (its helpers check that no
top-K choice is a near-tie).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from test_switchhead_attention import DH, D, E, H, K, sigmoid, top_k_heads

from sparse_jax.layers.switchhead_attention import SwitchHeadXLAttention

B, M, T = 2, 3, 4  # memory rows, segment rows
NAMES = ("w_q", "w_k", "w_v", "w_o", "sel_v", "sel_o", "w_pos")


def make(impl="auto", seed=0):
  """Random weights of order one, so that routing and attention are far from uniform."""
  layer = SwitchHeadXLAttention(D, H, DH, E, K, n_layers=2, impl=impl, rngs=nnx.Rngs(seed))
  graphdef, params, rest = nnx.split(layer, nnx.Param, ...)
  keys = iter(jax.random.split(jax.random.key(200 + seed), 16))
  params = jax.tree.map(lambda p: 0.6 * jax.random.normal(next(keys), p.shape, p.dtype), params)
  return nnx.merge(graphdef, params, rest)


def np_params(layer):
  return {name: np.asarray(getattr(layer, name)[...], np.float64) for name in NAMES}


def sinusoid(offset: float) -> np.ndarray:
  """`[D]`: sin at even, cos at odd channels, frequency 10000^(-2i/D)."""
  out = np.zeros(D)
  for i in range(D // 2):
    angle = offset / 10000.0 ** (2 * i / D)
    out[2 * i], out[2 * i + 1] = np.sin(angle), np.cos(angle)
  return out


def reference(p, ctx_bkd, mem_valid):
  ctx_bkd = np.asarray(ctx_bkd, np.float64)
  y_btd = np.zeros((B, T, D))
  for b in range(B):
    chosen_v = [top_k_heads(p, ctx_bkd[b, j], "sel_v") for j in range(M + T)]
    for h in range(H):
      k_kc = ctx_bkd[b] @ p["w_k"][:, h]
      v_kc = np.zeros((M + T, DH))
      for j in range(M + T):
        experts, gates, _ = chosen_v[j][h]
        for e, g in zip(experts, gates):
          v_kc[j] += g * (ctx_bkd[b, j] @ p["w_v"][h * E + e])
      for i in range(T):
        x = ctx_bkd[b, M + i]
        q = x @ p["w_q"][:, h]
        visible = [j for j in range(M + T) if M - mem_valid <= j <= M + i]
        scores = np.array([(q @ k_kc[j] + q @ (sinusoid(j - M - i) @ p["w_pos"][:, h]))
                           / np.sqrt(DH) for j in visible])
        probs = np.exp(scores - scores.max())
        a = (probs / probs.sum()) @ v_kc[visible]
        experts, gates, _ = top_k_heads(p, x, "sel_o")[h]
        for e, g in zip(experts, gates):
          y_btd[b, i] += g * (a @ p["w_o"][h * E + e])
  return y_btd


def context(seed=1):
  return jax.random.normal(jax.random.key(seed), (B, M + T, D), jnp.float32)


@pytest.mark.parametrize("mem_valid", [0, 2, M])
@pytest.mark.parametrize("impl", ["blocked", "gather"])
def test_matches_reference(mem_valid, impl):
  layer, ctx = make(impl), context()
  got = layer(ctx, T, jnp.asarray(mem_valid))
  np.testing.assert_allclose(np.asarray(got), reference(np_params(layer), ctx, mem_valid),
                             rtol=1e-5, atol=1e-5)


def test_gradients_match_finite_differences():
  """Directional derivatives of `<y, c>` for the context and every parameter (w_pos too)
  against central differences of the float64 reference."""
  layer, ctx = make(), context()
  graphdef, params, rest = nnx.split(layer, nnx.Param, ...)
  c_btd = np.asarray(jax.random.normal(jax.random.key(7), (B, T, D)), np.float64)

  def loss(params, ctx):
    out = nnx.merge(graphdef, params, rest)(ctx, T, jnp.asarray(2))
    return jnp.sum(out * c_btd.astype(np.float32))

  g_params, g_ctx = jax.grad(loss, argnums=(0, 1))(params, ctx)
  grads = {name: np.asarray(g_params[name][...], np.float64) for name in NAMES}
  grads["ctx"] = np.asarray(g_ctx, np.float64)
  base = {**np_params(layer), "ctx": np.asarray(ctx, np.float64)}

  def ref_loss(values):
    p = {n: v for n, v in values.items() if n != "ctx"}
    return np.sum(reference(p, values["ctx"], 2) * c_btd)

  rng, eps = np.random.default_rng(0), 1e-5
  for name, grad in grads.items():
    u = rng.standard_normal(grad.shape)
    fd = (ref_loss({**base, name: base[name] + eps * u})
          - ref_loss({**base, name: base[name] - eps * u})) / (2 * eps)
    np.testing.assert_allclose(np.sum(grad * u), fd, rtol=1e-4, atol=1e-5 * np.abs(grad).sum(),
                               err_msg=name)


def test_routing_shares_count_the_segment_only():
  layer, ctx = make(), context()
  _, aux = layer.apply_with_aux(ctx, T, jnp.asarray(M))
  assert aux["v_selection"].shape == (B, T, H, K)
  np.testing.assert_allclose(np.asarray(aux["v_token_share"]).sum(-1), K, rtol=1e-6)


def test_kv_cache_decoding_is_refused():
  with pytest.raises(NotImplementedError, match="XL memory"):
    make().init_cache(1, 4, jnp.float32)
