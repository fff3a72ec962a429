"""The baselines as the sigma-MoE authors ran them, against float64 numpy written from the
description of their code (docs/sigma_moe.md "The authors' code or the paper's text"), with gradients.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from sparse_jax.layers import build_ff

D, E, G = 12, 6, 5


def f64(a):
  return np.asarray(a, np.float64)


def softmax(z, axis=-1):
  e = np.exp(z - z.max(axis, keepdims=True))
  return e / e.sum(axis, keepdims=True)


def lse(z, axis):
  m = z.max(axis, keepdims=True)
  return np.log(np.exp(z - m).sum(axis, keepdims=True)) + m


def entropy_reg(logits):
  """Eq. 20: `sum p log p`, p the token mean of softmax(logits)."""
  p = softmax(logits).mean(0)
  return np.sum(p * np.log(p))


def ff(kind, seed=3, **fields):
  cfg = dict(kind=kind, n_experts=E, expert_size=G, impl="gather", **fields)
  return build_ff(cfg, d_model=D, n_layers=2, rngs=nnx.Rngs(seed))


def tokens(seed, shape):
  return jax.random.normal(jax.random.key(seed), shape)


def test_switch_drops_no_token_and_its_loss_is_eq17_over_n_e_squared():
  layer = ff("switch", reg_coef=0.01)
  layer.router.w_sel[...] = layer.router.w_sel[...].at[2].add(3.0)  # most tokens pick 2
  x_nd = jnp.abs(tokens(0, (40, D)))
  r = layer.router(x_nd)
  probs = softmax(f64(x_nd) @ f64(layer.router.w_sel).T)
  top = probs.argmax(1)
  assert np.bincount(top, minlength=E)[2] > 30  # far over any capacity ...
  np.testing.assert_array_equal(np.asarray(r.sel_nk[:, 0]), top)
  np.testing.assert_allclose(r.gates_nk[:, 0], probs[np.arange(40), top], rtol=1e-5)  # ... kept
  f = np.bincount(top, minlength=E) / 40
  assert float(r.reg_loss) == pytest.approx(0.01 * np.mean(probs * f[None, :]), rel=1e-5)
  eq17 = ff("switch", reg_coef=0.01, balance="eq17")
  nnx.update(eq17, nnx.state(layer))
  assert float(eq17.router(x_nd).reg_loss) == pytest.approx(E ** 2 * float(r.reg_loss),
                                                            rel=1e-5)


@pytest.mark.parametrize("init,scale,renormalised", [("switch", 0.2 / 3, False),
                                                      ("fedus", 0.1, False)])
def test_switch_inits(init, scale, renormalised):
  """switch: std sqrt(0.2 / (n_layers fan_in)) (n_layers 3); fedus: sqrt(0.1 / fan_in)."""
  d, e, g = 256, 64, 64
  layer = build_ff(dict(kind="switch", n_experts=e, expert_size=g, reg_coef=0.01, init=init),
                   d_model=d, n_layers=3, rngs=nnx.Rngs(0))
  for w, fan_in in ((layer.w_up, d), (layer.w_down, g), (layer.router.w_sel, d)):
    assert float(jnp.std(w[...])) == pytest.approx(np.sqrt(scale / fan_in), rel=0.05)
  norms = np.linalg.norm(f64(layer.router.w_sel), axis=1)
  assert norms.std() / norms.mean() > 0.01  # rows not renormalised (sigma's are equal)


def authors_sinkhorn(x_te, n_iters):
  """Their per-sequence iteration, one sequence `[T, E]`: per-token potentials b, then
  per-expert a; the log of their balanced matrix is x + a + b."""
  t, e = x_te.shape
  a, b = np.zeros((1, e)), np.zeros((t, 1))
  for _ in range(n_iters):
    b = np.log(t) - lse(x_te - a, 1)
    a = np.log(e) - lse(x_te - b, 0)
  return x_te + a + b


def chosen_sets(sel_nk):
  return [frozenset(row) for row in np.asarray(sel_nk).tolist()]


@pytest.mark.parametrize("k,n_iters", [(1, 3), (2, 1), (3, 5)])
def test_sbase_balances_each_sequence_with_the_authors_iteration(k, n_iters):
  layer = ff("sbase", k=k, reg_coef=0.01, sinkhorn_iters=n_iters)
  b, t = 3, 20
  x_btd = tokens(k, (b, t, D)) * 2
  logits = (f64(x_btd) @ f64(layer.router.w_sel).T)
  want = [frozenset(np.argsort(-row, kind="stable")[:k])
          for seq in logits for row in authors_sinkhorn(seq, n_iters)]
  r = layer.router(x_btd.reshape(-1, D), seq_len=t)
  assert chosen_sets(r.sel_nk) == want
  np.testing.assert_allclose(r.gates_nk, 1 / (1 + np.exp(-np.take_along_axis(
      logits.reshape(-1, E), np.asarray(r.sel_nk), 1))), rtol=1e-5)
  assert float(r.reg_loss) == pytest.approx(0.01 * entropy_reg(logits.reshape(-1, E)),
                                            rel=1e-5)
  whole = [frozenset(np.argsort(-row, kind="stable")[:k])
           for row in authors_sinkhorn(logits.reshape(-1, E), n_iters)]
  assert whole != want  # balancing per sequence is a different routing
  y, _ = layer(x_btd)  # the layer passes its sequence length on
  assert y.shape == x_btd.shape


def test_sbase_expert_dropout_skips_dropped_experts_in_training_only():
  layer = ff("sbase", k=2, reg_coef=0.0, expert_dropout=0.5)
  clean = ff("sbase", k=2, reg_coef=0.0)
  x_nd = tokens(4, (300, D))
  picked = layer.router(x_nd, seq_len=30).sel_nk
  changed = np.mean(np.asarray(picked) != np.asarray(clean.router(x_nd, seq_len=30).sel_nk))
  assert changed > 0.3
  layer.eval()
  clean.eval()
  np.testing.assert_array_equal(layer.router(x_nd).sel_nk, clean.router(x_nd).sel_nk)


def test_softmax_after_top_k_regularises_the_selected_logits_in_expert_order():
  layer = ff("softmax_moe", k=3, renorm=True, reg_coef=0.01)
  x_nd = tokens(5, (50, D))
  logits = f64(x_nd) @ f64(layer.router.w_sel).T
  r = layer.router(x_nd)
  chosen = np.sort(np.argsort(-logits, axis=1, kind="stable")[:, :3], axis=1)
  np.testing.assert_array_equal(np.sort(np.asarray(r.sel_nk), axis=1), chosen)
  np.testing.assert_allclose(
      r.gates_nk, softmax(np.take_along_axis(logits, np.asarray(r.sel_nk), 1)), rtol=1e-5)
  selected = np.take_along_axis(logits, chosen, 1)  # [N, k] in increasing expert id
  assert float(r.reg_loss) == pytest.approx(0.01 * entropy_reg(selected), rel=1e-5)
  everything = ff("softmax_moe", k=3, renorm=True, reg_coef=0.01, reg_logits="all")
  nnx.update(everything, nnx.state(layer))
  assert float(everything.router(x_nd).reg_loss) == pytest.approx(
      0.01 * entropy_reg(logits), rel=1e-5)
  assert abs(entropy_reg(selected) - entropy_reg(logits)) > 0.1


def test_softmax_expert_dropout_zeroes_probabilities_or_masks_logits():
  x_nd = tokens(6, (400, D))
  no_renorm = ff("softmax_moe", k=3, renorm=False, reg_coef=0.0, expert_dropout=0.8)
  r = no_renorm.router(x_nd)
  probs = softmax(f64(x_nd) @ f64(no_renorm.router.w_sel).T)
  gates, sel = np.asarray(r.gates_nk), np.asarray(r.sel_nk)
  zero = gates == 0  # a dropped expert picked anyway: P(more than 3 of 6 dropped) ~ 0.9
  assert 0.5 < zero.any(1).mean() < 1
  np.testing.assert_allclose(gates[~zero], np.take_along_axis(probs, sel, 1)[~zero], rtol=1e-5)
  renorm = ff("softmax_moe", k=3, renorm=True, reg_coef=0.0, expert_dropout=0.8)
  r = renorm.router(x_nd)
  np.testing.assert_allclose(r.gates_nk.sum(1), 1.0, rtol=1e-5)  # softmax of the raw logits
  renorm.eval()
  logits = f64(x_nd) @ f64(renorm.router.w_sel).T
  assert chosen_sets(renorm.router(x_nd).sel_nk) == [
      frozenset(np.argsort(-row)[:3]) for row in logits]


def test_sigma_moe_gives_a_dropped_but_picked_expert_gate_zero():
  layer = ff("sigma_moe", k=3, reg_coef=0.0, expert_dropout=0.95)
  x_nd = tokens(7, (200, D))
  r = layer.router(x_nd)
  s = 1 / (1 + np.exp(-(f64(x_nd) @ f64(layer.router.w_sel).T)))
  gates, sel = np.asarray(r.gates_nk), np.asarray(r.sel_nk)
  assert (gates == 0).mean() > 0.5
  np.testing.assert_allclose(gates[gates > 0], np.take_along_axis(s, sel, 1)[gates > 0],
                             rtol=1e-5)


def pkm_dense_reference(x_nd, sub_keys, values, activation):
  """Every value `j * n + i` scores `sum_h x_b . k_b[h, j] + x_a . k_a[h, i]`."""
  half = x_nd.shape[1] // 2
  sa = np.einsum("nd,hsd->nhs", x_nd[:, :half], sub_keys[:, 0]).sum(1)
  sb = np.einsum("nd,hsd->nhs", x_nd[:, half:], sub_keys[:, 1]).sum(1)
  scores = (sb[:, :, None] + sa[:, None, :]).reshape(len(x_nd), -1)
  weights = np.maximum(scores, 0) if activation == "relu" else softmax(scores)
  return weights @ values, weights


@pytest.mark.parametrize("activation", ["relu", "softmax"])
@pytest.mark.parametrize("d,n,knn,heads", [(8, 5, 5, 1), (12, 8, 16, 4)])
def test_pkm_dense_path_when_knn_covers_the_sub_keys(activation, d, n, knn, heads):
  layer = build_ff(dict(kind="pkm", n_subkeys=n, knn=knn, n_heads=heads, activation=activation),
                   d_model=d, n_layers=2, rngs=nnx.Rngs(0))
  x = tokens(8, (2, 3, d))
  y, aux = layer(x)
  want, weights = pkm_dense_reference(f64(x).reshape(-1, d), f64(layer.sub_keys),
                                      f64(layer.values), activation)
  np.testing.assert_allclose(f64(y).reshape(-1, d), want, rtol=1e-4, atol=1e-6)
  np.testing.assert_array_equal(aux["value_usage"], (weights > 0).sum(0))
  assert layer.flops_per_token() == heads * n * d + n * n * d

  def loss(x, sub_keys, values):
    out, _ = pkm_dense_reference(x, sub_keys, values, activation)
    return np.sum(out * np.cos(np.arange(out.size).reshape(out.shape)))

  def jax_loss(m, x):
    out, _ = m(x)
    return jnp.sum(out.reshape(-1, d) * jnp.cos(jnp.arange(out.size).reshape(-1, d)))

  grads = nnx.grad(jax_loss, argnums=(0, 1))(layer, x)
  args = [f64(x).reshape(-1, d), f64(layer.sub_keys), f64(layer.values)]
  got = [f64(grads[1]).reshape(-1, d), f64(grads[0]["sub_keys"]), f64(grads[0]["values"])]
  rng = np.random.default_rng(0)
  for which in range(3):
    for _ in range(4):  # central differences at random coordinates, in float64
      index = tuple(rng.integers(s) for s in args[which].shape)
      plus, minus = [a.copy() for a in args], [a.copy() for a in args]
      plus[which][index] += 1e-6
      minus[which][index] -= 1e-6
      numeric = (loss(*plus) - loss(*minus)) / 2e-6
      assert got[which][index] == pytest.approx(numeric, rel=2e-3, abs=1e-4)


def test_pkm_keeps_per_head_top_knn_when_asked_and_its_inits():
  d, n, knn, heads = 8, 5, 6, 2
  sparse = build_ff(dict(kind="pkm", n_subkeys=n, knn=knn, n_heads=heads,
                         dense_when_knn_covers=False), d_model=d, n_layers=2, rngs=nnx.Rngs(0))
  dense = build_ff(dict(kind="pkm", n_subkeys=n, knn=knn, n_heads=heads), d_model=d,
                   n_layers=2, rngs=nnx.Rngs(0))
  x_nd = tokens(9, (7, d))
  keys, values = f64(sparse.sub_keys), f64(sparse.values)
  want = np.zeros((7, d))
  for t, x in enumerate(f64(x_nd)):
    for h in range(heads):
      scores = ((x[d // 2:] @ keys[h, 1].T)[:, None] + (x[:d // 2] @ keys[h, 0].T)[None, :])
      top = np.argsort(-scores.reshape(-1))[:knn]
      want[t] += np.maximum(scores.reshape(-1)[top], 0) @ values[top]
  np.testing.assert_allclose(sparse(x_nd)[0], want, rtol=1e-4, atol=1e-6)
  assert np.abs(f64(dense(x_nd)[0]) - want).max() > 1e-3

  big = dict(kind="pkm", n_subkeys=64, knn=8, n_heads=4)
  authors = build_ff(big, d_model=128, n_layers=4, rngs=nnx.Rngs(0))
  paper_init = build_ff({**big, "init": "dense"}, d_model=128, n_layers=4, rngs=nnx.Rngs(0))
  std = np.sqrt(2 / (4 * 128))
  assert f64(authors.sub_keys).std() == pytest.approx(std, rel=0.03)
  assert f64(authors.values).std() == pytest.approx(std, rel=0.03)
  assert f64(paper_init.values).std() == pytest.approx(np.sqrt(2 / (4 * 64 ** 2)), rel=0.03)
