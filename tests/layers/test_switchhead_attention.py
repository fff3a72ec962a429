"""SwitchHead attention against a float64 numpy reference written from the paper's equations.

The layer runs in float32 (its router scores, softmax and cvmm accumulate in float32), so values
are compared at float32 tolerances; with random weights the per-head top-K choices are the same
in both precisions because the test checks that the K-th and (K+1)-th sigmoid scores are far
apart (no near-ties that a float32 rounding could flip).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from attention_testing import decode_all, naive_rotary
from sparse_jax.layers.counting import count_params
from sparse_jax.layers.switchhead_attention import SwitchHeadAttention, renorm_rows

D, H, DH, E, K = 8, 2, 4, 3, 2
B, T = 2, 5


def make(positions="rope", rope_fraction=0.5, impl="auto", seed=0):
  """A layer with random weights of order one (not the small init), so that routing and
  attention are far from uniform."""
  layer = SwitchHeadAttention(D, H, DH, E, K, n_layers=2, positions=positions,
                              rope_fraction=rope_fraction, impl=impl, rngs=nnx.Rngs(seed))
  graphdef, params, rest = nnx.split(layer, nnx.Param, ...)
  keys = iter(jax.random.split(jax.random.key(100 + seed), 16))
  params = jax.tree.map(lambda p: 0.6 * jax.random.normal(next(keys), p.shape, p.dtype), params)
  return nnx.merge(graphdef, params, rest)


def np_params(layer):
  return {name: np.asarray(getattr(layer, name)[...], np.float64)
          for name in ("w_q", "w_k", "w_v", "w_o", "sel_v", "sel_o")}


def sigmoid(z):
  return 1.0 / (1.0 + np.exp(-z))


def top_k_heads(p, x_d, router):
  """Per head: (chosen experts, their sigmoid scores, the margin between the K-th and the
  (K+1)-th score)."""
  out = []
  for h in range(H):
    s_e = sigmoid(p[router][h * E:(h + 1) * E] @ x_d)
    order = np.argsort(-s_e)
    out.append((order[:K], s_e[order[:K]], s_e[order[K - 1]] - s_e[order[K]]))
  return out


def reference(p, x_btd, *, n_rotate, v_btd=None):
  """Loops over batch, heads, tokens and chosen experts (paper's equations, float64).
  `v_btd`: the expert values' input (MoEUT), routers and q, k still read `x_btd`."""
  x_btd = np.asarray(x_btd, np.float64)
  v_btd = x_btd if v_btd is None else np.asarray(v_btd, np.float64)
  y_btd = np.zeros_like(x_btd)
  margins = []
  for b in range(B):
    sel_v = [top_k_heads(p, x_btd[b, t], "sel_v") for t in range(T)]
    sel_o = [top_k_heads(p, x_btd[b, t], "sel_o") for t in range(T)]
    for h in range(H):
      q_tc, k_tc, v_tc = np.zeros((T, DH)), np.zeros((T, DH)), np.zeros((T, DH))
      for t in range(T):
        x = x_btd[b, t]
        q, k = x @ p["w_q"][:, h], x @ p["w_k"][:, h]
        if n_rotate:
          q[:n_rotate] = naive_rotary(q[:n_rotate], t)
          k[:n_rotate] = naive_rotary(k[:n_rotate], t)
        q_tc[t], k_tc[t] = q, k
        experts, gates, margin = sel_v[t][h]
        margins.append(margin)
        for e, g in zip(experts, gates):
          v_tc[t] += g * (v_btd[b, t] @ p["w_v"][h * E + e])
      for t in range(T):
        scores = np.array([q_tc[t] @ k_tc[j] / np.sqrt(DH) for j in range(t + 1)])
        probs = np.exp(scores - scores.max())
        probs /= probs.sum()
        a = probs @ v_tc[:t + 1]
        experts, gates, margin = sel_o[t][h]
        margins.append(margin)
        for e, g in zip(experts, gates):
          y_btd[b, t] += g * (a @ p["w_o"][h * E + e])
  assert min(margins) > 1e-4, "near-tie in a top-K: pick another seed"
  return y_btd


def inputs(seed=1):
  return jax.random.normal(jax.random.key(seed), (B, T, D), jnp.float32)


@pytest.mark.parametrize("positions,rope_fraction,n_rotate",
                         [("rope", 0.5, 2), ("rope", 1.0, 4), ("none", 0.5, 0)])
def test_matches_reference(positions, rope_fraction, n_rotate):
  layer, x = make(positions, rope_fraction), inputs()
  want = reference(np_params(layer), x, n_rotate=n_rotate)
  np.testing.assert_allclose(np.asarray(layer(x)), want, rtol=1e-5, atol=1e-5)


def test_separate_value_input():
  """MoEUT feeds the expert values the raw residual and everything else its LayerNorm."""
  layer, x, xv = make("rope", 0.5), inputs(), inputs(seed=5)
  want = reference(np_params(layer), x, n_rotate=2, v_btd=xv)
  np.testing.assert_allclose(np.asarray(layer.apply_with_aux(x, xv)[0]), want, rtol=1e-5,
                             atol=1e-5)


@pytest.mark.parametrize("impl", ["gather", "ragged", "pallas"])
def test_cvmm_impls_agree(impl):
  """The default on CPU is "blocked" (tested above); the others give the same values."""
  layer, x = make(impl=impl), inputs()
  want = reference(np_params(layer), x, n_rotate=2)
  np.testing.assert_allclose(np.asarray(layer(x)), want, rtol=1e-5, atol=1e-5)


def test_gradients_match_finite_differences():
  """Directional derivatives of `<y, c>` along random directions, for the input and every
  parameter: the layer's float32 gradient (cvmm's custom VJP) against central differences of
  the float64 reference (truncation ~eps^2, far below float32 precision)."""
  layer, x = make("rope", 0.5), inputs()
  graphdef, params, rest = nnx.split(layer, nnx.Param, ...)
  c_btd = np.asarray(jax.random.normal(jax.random.key(7), (B, T, D)), np.float64)

  def loss(params, x):
    return jnp.sum(nnx.merge(graphdef, params, rest)(x) * c_btd.astype(np.float32))

  g_params, g_x = jax.grad(loss, argnums=(0, 1))(params, x)
  grads = {name: np.asarray(g_params[name][...], np.float64) for name in np_params(layer)}
  grads["x"] = np.asarray(g_x, np.float64)
  base = {**np_params(layer), "x": np.asarray(x, np.float64)}

  def ref_loss(values):
    p = {n: v for n, v in values.items() if n != "x"}
    return np.sum(reference(p, values["x"], n_rotate=2) * c_btd)

  rng, eps = np.random.default_rng(0), 1e-5
  for name, grad in grads.items():
    for _ in range(2):
      u = rng.standard_normal(grad.shape)
      plus = ref_loss({**base, name: base[name] + eps * u})
      minus = ref_loss({**base, name: base[name] - eps * u})
      fd = (plus - minus) / (2 * eps)
      np.testing.assert_allclose(np.sum(grad * u), fd, rtol=1e-4, atol=1e-5 * np.abs(grad).sum(),
                                 err_msg=name)


def test_decode_matches_full_forward():
  layer, x = make("rope", 0.5), inputs()
  np.testing.assert_allclose(np.asarray(decode_all(layer, x, max_len=T + 2)),
                             np.asarray(layer(x)), rtol=1e-5, atol=1e-5)


def test_causal():
  layer, x = make("rope", 0.5), inputs()
  t0 = 3
  x2 = x.at[:, t0:].set(jax.random.normal(jax.random.key(9), (B, T - t0, D)))
  y, y2 = np.asarray(layer(x)), np.asarray(layer(x2))
  np.testing.assert_allclose(y2[:, :t0], y[:, :t0], rtol=1e-6, atol=1e-6)
  assert np.abs(y2[:, t0:] - y[:, t0:]).max() > 1e-3


def test_top_k_per_head_with_sigmoid_gates():
  layer, x = make("none"), inputs()
  p = np_params(layer)
  _, aux = layer.apply_with_aux(x)
  for router, key in (("sel_v", "v_selection"), ("sel_o", "o_selection")):
    sel = np.asarray(aux[key])
    assert sel.shape == (B, T, H, K) and sel.dtype == np.int32
    gates, chosen, _ = layer.route(x, getattr(layer, router))
    np.testing.assert_array_equal(np.asarray(chosen), sel)
    for b in range(B):
      for t in range(T):
        for h, (experts, scores, _) in enumerate(top_k_heads(p, np.asarray(x[b, t]), router)):
          assert len(set(sel[b, t, h])) == K and sel[b, t, h].max() < E
          assert set(sel[b, t, h]) == set(experts)
          want = dict(zip(experts, scores))
          np.testing.assert_allclose(np.asarray(gates[b, t, h]),
                                     [want[e] for e in sel[b, t, h]], rtol=1e-5)
  for key in ("v_token_share", "o_token_share"):
    assert aux[key].shape == (H, E)
    np.testing.assert_allclose(np.asarray(aux[key]).sum(axis=1), K, rtol=1e-6)


@pytest.mark.parametrize("kwargs,field", [
    ({"d_model": 0}, "d_model"), ({"n_heads": -1}, "n_heads"), ({"head_dim": 0}, "head_dim"),
    ({"n_experts": 1}, "n_experts"), ({"k": 4}, "k"), ({"k": 0}, "k"),
    ({"n_layers": 0}, "n_layers"), ({"positions": "xl"}, "positions"),
    ({"rope_fraction": 0.25}, "rope_fraction"), ({"attn_dropout": 1.0}, "attn_dropout"),
    ({"impl": "cuda"}, "impl")])
def test_config_errors_name_the_field(kwargs, field):
  args = {"d_model": D, "n_heads": H, "head_dim": DH, "n_experts": E, "k": K, "n_layers": 2,
          **kwargs}
  with pytest.raises(ValueError, match=field):
    SwitchHeadAttention(**args, rngs=nnx.Rngs(0))


def test_param_count_and_macs():
  layer = SwitchHeadAttention(12, 3, 4, 5, 2, n_layers=2, rngs=nnx.Rngs(0))
  d, h, c, e, k = 12, 3, 4, 5, 2
  closed_form = 2 * d * h * c + 2 * h * e * d * c + 2 * h * e * d
  assert count_params(layer) == closed_form
  assert layer.flops_per_token() == 2 * d * h * c + 2 * k * h * d * c + 2 * h * e * d


def test_init_scales_and_router_renorm():
  """Authors' init (switchhead.py `reset_parameters`, `renorm_rows`) with s = sqrt(2 / L)."""
  d, h, c, e, n_layers = 64, 4, 16, 8, 4
  layer = SwitchHeadAttention(d, h, c, e, 2, n_layers=n_layers, rngs=nnx.Rngs(3))
  s = np.sqrt(2 / n_layers)
  for name, std in (("w_q", s / np.sqrt(d)), ("w_k", s / np.sqrt(d)), ("w_v", s / np.sqrt(d)),
                    ("w_o", s / np.sqrt(h * c)), ("sel_v", s / np.sqrt(d))):
    np.testing.assert_allclose(np.std(np.asarray(getattr(layer, name)[...])), std, rtol=0.1,
                               err_msg=name)
  w = np.random.default_rng(0).standard_normal((6, 10)) * 0.3
  unit = w / np.linalg.norm(w, axis=1, keepdims=True)
  want = unit * w.std(axis=1, ddof=1, keepdims=True) / unit.std(ddof=1)
  np.testing.assert_allclose(np.asarray(renorm_rows(jnp.asarray(w))), want, rtol=1e-5)
