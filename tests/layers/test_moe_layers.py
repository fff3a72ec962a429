"""sigma-MoE and the MoE variants against float64 numpy implementations of the paper."""

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from flax import nnx

from sparse_jax.layers import build_ff
from sparse_jax.layers.moe import SigmaMoE
from sparse_jax.layers.routers import Router, sbase, switch

D, E, G = 12, 6, 5


def f64(a):
  return np.asarray(a, np.float64)


def numpy_sigma_moe(x_nd, w_up, w_down, w_sel, k):
  """Eq. 11 one token at a time: `y = sum_{e in topk(s)} s[e] ReLU(x W1^e) W2^e`."""
  s_ne = 1 / (1 + np.exp(-(x_nd @ w_sel.T)))
  y = np.zeros_like(x_nd)
  for n in range(len(x_nd)):
    for e in np.argsort(-s_ne[n])[:k]:
      y[n] += s_ne[n, e] * np.maximum(x_nd[n] @ w_up[e], 0) @ w_down[e]
  return y


def numpy_entropy_reg(x_nd, w_sel):
  """Eq. 20: `sum p log p`, p the mean over all tokens of softmax(x W3^T)."""
  logits = x_nd @ w_sel.T
  probs = np.exp(logits - logits.max(1, keepdims=True))
  probs /= probs.sum(1, keepdims=True)
  p = probs.mean(0)
  return np.sum(p * np.log(p))


def random_x(seed, shape=(3, 7, D)):
  return jax.random.normal(jax.random.key(seed), shape)


@pytest.mark.parametrize("k", [1, 3])
def test_sigma_moe_matches_eq11_and_eq20(k):
  moe = SigmaMoE(D, E, G, k, n_layers=2, reg_coef=0.01, impl="gather", rngs=nnx.Rngs(0))
  moe.eval()
  x = random_x(k)
  y, aux = moe(x)
  x_nd = f64(x).reshape(-1, D)
  want = numpy_sigma_moe(x_nd, f64(moe.w_up), f64(moe.w_down), f64(moe.router.w_sel), k)
  np.testing.assert_allclose(f64(y).reshape(-1, D), want, rtol=1e-4, atol=1e-5)
  assert float(aux["reg_loss"]) == pytest.approx(
      0.01 * numpy_entropy_reg(x_nd, f64(moe.router.w_sel)), rel=1e-5)
  assert int(aux["expert_usage"].sum()) == x_nd.shape[0] * k


def test_sigma_moe_with_all_experts_is_a_dense_mlp_scaled_by_scores():
  moe = SigmaMoE(D, E, G, E, n_layers=2, impl="gather", rngs=nnx.Rngs(1))
  moe.eval()
  x = random_x(5)
  x_nd = f64(x).reshape(-1, D)
  w1 = np.concatenate(list(f64(moe.w_up)), axis=1)  # [D, E*G]
  w2 = np.concatenate(list(f64(moe.w_down)), axis=0)  # [E*G, D]
  s = 1 / (1 + np.exp(-(x_nd @ f64(moe.router.w_sel).T)))
  want = (np.maximum(x_nd @ w1, 0) * np.repeat(s, G, axis=1)) @ w2
  np.testing.assert_allclose(f64(moe(x)[0]).reshape(-1, D), want, rtol=1e-4, atol=1e-5)


def test_expert_dropout_drops_whole_experts_in_training_only():
  delta = 0.3
  moe = SigmaMoE(D, E, G, 2, n_layers=2, expert_dropout=delta, impl="gather",
                 rngs=nnx.Rngs(2))
  x_nd = random_x(6, (4000, D))
  s = jax.nn.sigmoid(x_nd @ moe.router.w_sel[...].T)
  best_n = jnp.argmax(s, axis=1)
  routing = moe.router(x_nd)
  # The best expert is missing exactly when it was dropped: probability delta.
  missing = float(jnp.mean(jnp.all(routing.sel_nk != best_n[:, None], axis=1)))
  assert abs(missing - delta) < 0.03  # binomial std 0.007
  gates, raw = np.asarray(routing.gates_nk), np.asarray(jnp.take_along_axis(s, routing.sel_nk, 1))
  picked_dropped = gates == 0  # only when more than E - k = 4 of 6 are dropped: P ~ 1.1%
  assert 0.002 < picked_dropped.any(1).mean() < 0.025
  np.testing.assert_allclose(gates[~picked_dropped], raw[~picked_dropped],
                             rtol=1e-6)  # gates are the raw scores: no rescaling
  moe.eval()
  np.testing.assert_array_equal(moe.router(x_nd).sel_nk, jax.lax.top_k(s, 2)[1])


def test_standard_init_uses_one_expert_fan_in():
  sigma = SigmaMoE(64, 16, 32, 2, n_layers=1, rngs=nnx.Rngs(0))
  standard = SigmaMoE(64, 16, 32, 2, n_layers=1, init="standard", rngs=nnx.Rngs(0))
  assert float(jnp.std(sigma.w_down[...])) == pytest.approx(np.sqrt(2 / (16 * 32)), rel=0.05)
  assert float(jnp.std(standard.w_down[...])) == pytest.approx(np.sqrt(2 / 32), rel=0.05)
  w_sel = np.asarray(sigma.router.w_sel[...])
  norms = np.linalg.norm(w_sel, axis=1)
  np.testing.assert_allclose(norms, norms[0], rtol=1e-5)
  assert w_sel.std() == pytest.approx(np.sqrt(2 / 64), rel=1e-4)


def ff(kind, **fields):
  cfg = ml_collections.ConfigDict(dict(kind=kind, n_experts=E, expert_size=G, impl="gather",
                                       **fields))
  return build_ff(cfg, d_model=D, n_layers=2, rngs=nnx.Rngs(3))


def test_switch_drops_tokens_over_capacity_and_balance_loss_is_eq17():
  layer = ff("switch", capacity_factor=1.5, reg_coef=0.01, balance="eq17")
  direction = jnp.zeros((D,)).at[0].set(1.0)
  layer.router.w_sel[...] = layer.router.w_sel[...].at[2].set(10 * direction)
  x_nd = jnp.abs(random_x(7, (40, D))) + direction * 3  # every token prefers expert 2
  y, aux = layer(x_nd)
  cap = int(np.ceil(1.5 * 40 / E))
  assert np.all(np.abs(np.asarray(y[:cap])).max(axis=1) > 0)
  np.testing.assert_array_equal(np.asarray(y[cap:]), 0.0)
  assert int(aux["expert_usage"][2]) == cap

  x2 = random_x(8, (50, D)).reshape(-1, D)
  logits = f64(x2) @ f64(layer.router.w_sel).T
  probs = np.exp(logits - logits.max(1, keepdims=True))
  probs /= probs.sum(1, keepdims=True)
  f = np.bincount(probs.argmax(1), minlength=E) / len(probs)
  want = 0.01 * E * f @ probs.mean(0)
  assert float(layer(x2)[1]["reg_loss"]) == pytest.approx(want, rel=1e-5)
  assert switch.capacity(40, E, 1.5) == cap


def test_noisy_topk_renormalises_and_is_noise_free_in_eval():
  layer = ff("noisy_topk", k=2, reg_coef=0.01)
  layer.router.w_noise[...] = 0.5 * jax.random.normal(jax.random.key(0), (E, D))
  x_nd = random_x(9, (30, D))
  train_r = layer.router(x_nd)
  np.testing.assert_allclose(train_r.gates_nk.sum(1), 1.0, rtol=1e-6)
  layer.eval()
  r = layer.router(x_nd)
  logits = f64(x_nd) @ f64(layer.router.w_sel).T
  top = np.sort(logits, axis=1)[:, ::-1][:, :2]
  want = np.exp(top) / np.exp(top).sum(1, keepdims=True)
  np.testing.assert_allclose(r.gates_nk, want, rtol=1e-5)
  assert not np.array_equal(train_r.sel_nk, r.sel_nk)  # training noise changed choices
  importance = np.zeros(E)
  np.add.at(importance, np.asarray(r.sel_nk), np.asarray(r.gates_nk, np.float64))
  assert float(r.reg_loss) == pytest.approx(0.01 * importance.std() / importance.mean(),
                                            rel=1e-4)  # Eq. 14: the CV, not squared


def test_sbase_balances_a_skewed_batch_and_uses_top_k_in_eval():
  n = 600
  x_nd = random_x(10, (n, D))
  bias = jnp.zeros((E, D)).at[0, 0].set(5.0)
  x_nd = x_nd.at[:, 0].set(4.0)  # a large shared component: expert 0 wins for every token
  textbook = ff("sbase", k=1, reg_coef=0.0, balance_over="batch", sinkhorn="standard")
  authors = ff("sbase", k=1, reg_coef=0.0)
  for layer in (textbook, authors):
    layer.router.w_sel[...] = layer.router.w_sel[...] + bias
  balanced = np.bincount(np.asarray(textbook.router(x_nd).sel_nk[:, 0]), minlength=E)
  assert balanced.min() > 0.5 * n / E and balanced.max() < 1.5 * n / E
  # The authors' iteration balances less tightly, but no expert takes most tokens.
  theirs = np.bincount(np.asarray(authors.router(x_nd, seq_len=n).sel_nk[:, 0]), minlength=E)
  assert theirs.min() > 0 and theirs.max() < 0.4 * n
  authors.eval()
  plain = np.bincount(np.asarray(authors.router(x_nd).sel_nk[:, 0]), minlength=E)
  assert plain[0] > 0.9 * n
  log_p = sbase.sinkhorn(jax.random.normal(jax.random.key(1), (n, E)) * 3, 20)
  np.testing.assert_allclose(np.exp(log_p).sum(0), 1 / E, rtol=1e-3)


@pytest.mark.parametrize("renorm", [True, False])
def test_softmax_moe_gates(renorm):
  layer = ff("softmax_moe", k=2, renorm=renorm, reg_coef=0.0)
  x_nd = random_x(11, (20, D))
  r = layer.router(x_nd)
  logits = f64(x_nd) @ f64(layer.router.w_sel).T
  probs = np.exp(logits) / np.exp(logits).sum(1, keepdims=True)
  top = np.sort(probs, axis=1)[:, ::-1][:, :2]
  want = top / top.sum(1, keepdims=True) if renorm else top
  np.testing.assert_allclose(r.gates_nk, want, rtol=1e-5)


MOE_KINDS = [
    ("sigma_moe", dict(k=2, reg_coef=0.001)), ("switch", dict(reg_coef=0.01)),
    ("noisy_topk", dict(k=2, reg_coef=0.01)), ("sbase", dict(k=2, reg_coef=0.001)),
    ("softmax_moe", dict(k=2, renorm=False, reg_coef=0.001))]


@pytest.mark.parametrize("kind,fields", MOE_KINDS)
def test_gradients_reach_the_selector_and_param_counts(kind, fields):
  layer = ff(kind, **fields)
  x = random_x(12)

  def loss(m):
    y, aux = m(x)
    return jnp.sum(y ** 2) + aux["reg_loss"]

  grads = nnx.grad(loss)(layer)
  assert np.abs(np.asarray(grads["router"]["w_sel"])).max() > 0
  selector = E * D * (2 if kind == "noisy_topk" else 1)
  assert sum(p.size for p in jax.tree.leaves(nnx.state(layer, nnx.Param))) == (
      2 * E * D * G + selector)


@pytest.mark.parametrize("kind,fields", MOE_KINDS)
def test_router_contract_k_and_flops(kind, fields):
  """Every router is a `Router` with its `k` (Switch: 1) and its own multiply-adds: the
  selector's `d_model * E`, twice with the noisy router's noise net."""
  layer = ff(kind, **fields)
  router = layer.router
  assert isinstance(router, Router)
  assert router.k == fields.get("k", 1)
  assert router.flops_per_token() == D * E * (2 if kind == "noisy_topk" else 1)
  assert layer.flops_per_token() == router.flops_per_token() + router.k * 2 * D * G
