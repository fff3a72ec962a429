"""The routing statistics MoE layers put in their aux for routing health: every kind's
`token_share`, Switch's dropped and S-BASE's re-routed fraction, against numpy."""

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from flax import nnx

from sparse_jax.layers import build_ff

D, E, G = 12, 6, 5


def ff(kind, **fields):
  cfg = ml_collections.ConfigDict(dict(kind=kind, n_experts=E, expert_size=G, impl="gather",
                                       **fields))
  return build_ff(cfg, d_model=D, n_layers=2, rngs=nnx.Rngs(3))


def random_x(seed, shape):
  return jax.random.normal(jax.random.key(seed), shape)


@pytest.mark.parametrize("kind,fields", [
    ("sigma_moe", dict(k=2, reg_coef=0.0)), ("switch", dict(reg_coef=0.0)),
    ("sbase", dict(k=2, reg_coef=0.0)), ("noisy_topk", dict(k=3, reg_coef=0.0)),
    ("softmax_moe", dict(k=2, renorm=True, reg_coef=0.0))])
def test_token_share_is_each_experts_fraction_of_tokens(kind, fields):
  layer = ff(kind, **fields)
  layer.eval()  # so that calling the router again gives the same routing (no noise)
  x_btd = random_x(1, (3, 8, D))
  _, aux = layer(x_btd)
  r = layer.router(x_btd.reshape(-1, D), seq_len=8)
  sel_nk, active_nk = np.asarray(r.sel_nk), np.asarray(r.gates_nk) != 0
  want_e = np.array([np.sum((sel_nk == e) & active_nk) for e in range(E)]) / 24
  np.testing.assert_allclose(aux["token_share"], want_e, rtol=1e-6)
  assert aux["token_share"].dtype == jnp.float32
  stats = {"switch": {"dropped_fraction"}, "sbase": {"rerouted_fraction"},
           "sigma_moe": {"router_logits"}}.get(kind, set())  # sigma's: MoEUT's regulariser
  assert set(aux) - {"reg_loss", "expert_usage", "token_share"} == stats


def test_switch_reports_the_tokens_over_capacity():
  layer = ff("switch", capacity_factor=1.5, reg_coef=0.0)
  direction = jnp.zeros((D,)).at[0].set(1.0)
  layer.router.w_sel[...] = layer.router.w_sel[...].at[2].set(10 * direction)
  x_nd = jnp.abs(random_x(7, (40, D))) + direction * 3  # every token prefers expert 2
  _, aux = layer(x_nd)
  cap = int(np.ceil(1.5 * 40 / E))
  assert float(aux["dropped_fraction"]) == pytest.approx(1 - cap / 40)
  assert float(aux["token_share"][2]) == pytest.approx(cap / 40)
  _, aux = ff("switch", reg_coef=0.0)(x_nd)  # no capacity: nothing dropped
  assert float(aux["dropped_fraction"]) == 0.0


def test_sbase_rerouted_fraction_counts_slots_outside_the_tokens_own_top_k():
  layer = ff("sbase", k=2, reg_coef=0.0, balance_over="batch", sinkhorn="standard")
  x_nd = random_x(10, (60, D)).at[:, 0].set(4.0)
  layer.router.w_sel[...] = layer.router.w_sel[...].at[0, 0].add(5.0)  # skewed: rebalanced
  r = layer.router(x_nd)
  scores_ne = 1 / (1 + np.exp(-(np.asarray(x_nd, np.float64)
                                @ np.asarray(layer.router.w_sel[...], np.float64).T)))
  own_top_nk = np.argsort(-scores_ne, axis=1)[:, :2]
  sel_nk = np.asarray(r.sel_nk)
  moved = np.mean([sel_nk[n, j] not in own_top_nk[n] for n in range(60) for j in range(2)])
  assert 0 < moved < 1
  assert float(r.stats["rerouted_fraction"]) == pytest.approx(moved)
  layer.eval()  # evaluation routes by the plain top-k: nothing re-routed
  assert float(layer.router(x_nd).stats["rerouted_fraction"]) == 0.0
