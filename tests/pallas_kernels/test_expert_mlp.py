"""expert_mlp (the fused MoE feed-forward) of every impl against a float64 brute force.

The reference gathers every slot's two weight matrices and differentiates the whole layer
with jax.grad in float64 (independent of the custom VJP under test). Tolerances are cvmm's
(`cvmm_testing.TOL`), relative to the largest reference value.
"""

import dataclasses
import importlib.util

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from cvmm_testing import IMPLS, assert_close
from pallas_kernels import expert_mlp
from pallas_kernels.expert_mlp import dropout_keep_mask


@dataclasses.dataclass(frozen=True)
class Case:
  """routing: "random", "one_expert" (all slots on the last expert) or "sparse" (even ids)."""
  n: int
  k: int
  experts: int
  d: int
  g: int
  routing: str
  dtype: str

  def __str__(self):
    return f"N{self.n}-k{self.k}-E{self.experts}-d{self.d}-G{self.g}-{self.routing}-{self.dtype}"


CASES = (
    Case(37, 2, 5, 48, 24, "random", "float32"),
    Case(64, 1, 16, 16, 16, "sparse", "float32"),
    Case(20, 3, 1, 32, 16, "random", "float32"),
    Case(50, 4, 6, 16, 48, "one_expert", "float32"),
    Case(40, 2, 8, 32, 32, "sparse", "bfloat16"),
    # k = 1 and N off the 64-row tile (x and dy are read through the sorted index on pallas).
    Case(67, 1, 4, 40, 24, "random", "float32"),
)
MOSAIC_CASES = (
    Case(300, 4, 16, 128, 64, "sparse", "bfloat16"),
    Case(70, 1, 3, 64, 128, "one_expert", "bfloat16"),
)


def _params():
  params = [pytest.param(c, i, id=f"{i}-{c}") for i in IMPLS for c in CASES]
  params += [pytest.param(c, "megablox", id=f"megablox-{c}") for c in CASES[::2]]
  gpu = pytest.mark.skipif(jax.default_backend() != "gpu", reason="Mosaic GPU needs a GPU")
  params += [pytest.param(c, "mosaic", id=f"mosaic-{c}", marks=gpu) for c in MOSAIC_CASES]
  tokamax = pytest.mark.skipif(importlib.util.find_spec("tokamax") is None,
                               reason="tokamax is not installed")
  params += [pytest.param(CASES[0], "tokamax", id=f"tokamax-{CASES[0]}", marks=tokamax)]
  return params


def _inputs(case: Case, seed: int = 0):
  rng = np.random.default_rng(seed)
  if case.routing == "random":
    sel = np.stack([rng.permutation(case.experts)[:case.k] if case.k <= case.experts else
                    rng.integers(0, case.experts, case.k) for _ in range(case.n)])
  elif case.routing == "one_expert":
    sel = np.full((case.n, case.k), case.experts - 1)
  else:
    sel = 2 * rng.integers(0, (case.experts + 1) // 2, (case.n, case.k))
  as_dtype = lambda a: np.asarray(jnp.asarray(a, case.dtype))
  return dict(
      x=as_dtype(rng.standard_normal((case.n, case.d))),
      sel=sel.astype(np.int32),
      gates=as_dtype(rng.uniform(0.1, 1.0, (case.n, case.k))),
      w_up=as_dtype(rng.standard_normal((case.experts, case.d, case.g)) / np.sqrt(case.d)),
      w_down=as_dtype(rng.standard_normal((case.experts, case.g, case.d)) / np.sqrt(case.g)),
      ct=as_dtype(rng.standard_normal((case.n, case.d))))


def _reference(inputs, keep=None, rate=0.0):
  """float64 value and gradients (x, gates, w_up, w_down) of <expert_mlp(...), ct>."""
  sel = inputs["sel"]

  def loss(x, gates, w_up, w_down):
    a = jax.nn.relu(jnp.einsum("nd,nkdg->nkg", x, w_up[sel]))
    if keep is not None:
      a = jnp.where(keep, a / (1.0 - rate), 0.0)
    y = jnp.einsum("nk,nkg,nkgd->nd", gates, a, w_down[sel])
    return jnp.sum(y * inputs["ct"]), y

  with jax.enable_x64(True):
    args = [jnp.asarray(inputs[name], jnp.float64) for name in ("x", "gates", "w_up", "w_down")]
    (_, y), grads = jax.value_and_grad(loss, argnums=(0, 1, 2, 3), has_aux=True)(*args)
    return np.asarray(y), [np.asarray(g) for g in grads]


def _run(inputs, impl, rate=0.0, key=None):
  def loss(x, gates, w_up, w_down):
    y = expert_mlp(x, inputs["sel"], gates, w_up, w_down, impl=impl, dropout_rate=rate,
                   dropout_key=key)
    return jnp.sum(y.astype(jnp.float32) * inputs["ct"].astype(jnp.float32)), y

  args = [inputs[name] for name in ("x", "gates", "w_up", "w_down")]
  (_, y), grads = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2, 3), has_aux=True))(*args)
  return y, grads


@pytest.mark.parametrize("case, impl", _params())
def test_values_and_gradients_match_float64(case, impl):
  inputs = _inputs(case)
  y, grads = _run(inputs, impl)
  want_y, want_grads = _reference(inputs)
  assert y.dtype == jnp.dtype(case.dtype)
  assert_close(y, want_y, case.dtype, f"{impl} y")
  for got, want, name in zip(grads, want_grads, ("dx", "dgates", "dw_up", "dw_down")):
    assert got.dtype == jnp.dtype(case.dtype), name
    assert_close(got, want, case.dtype, f"{impl} {name}")
  unused = np.setdiff1d(np.arange(case.experts), inputs["sel"])
  assert not np.any(np.asarray(grads[2])[unused]) and not np.any(np.asarray(grads[3])[unused])


@pytest.mark.parametrize("impl", [*IMPLS, "megablox"])
def test_hidden_dropout_matches_float64_with_the_same_mask(impl):
  case, rate, key = CASES[0], 0.3, jax.random.key(7)
  inputs = _inputs(case, seed=3)
  y, grads = _run(inputs, impl, rate, key)
  keep = np.asarray(dropout_keep_mask(key, rate, (case.n, case.k, case.g)))
  assert 0.5 < keep.mean() < 0.9  # The mask really drops units.
  want_y, want_grads = _reference(inputs, keep, rate)
  assert_close(y, want_y, case.dtype, f"{impl} y")
  for got, want, name in zip(grads, want_grads, ("dx", "dgates", "dw_up", "dw_down")):
    assert_close(got, want, case.dtype, f"{impl} {name}")


def test_dropout_keeps_units_at_one_minus_its_rate():
  keep = dropout_keep_mask(jax.random.key(0), 0.3, (4000, 1, 16))
  assert abs(float(jnp.mean(keep)) - 0.7) < 0.01  # 64000 draws: std of the mean 0.0018.
  assert dropout_keep_mask(None, 0.3, (4, 1, 16)) is None
  assert dropout_keep_mask(jax.random.key(0), 0.0, (4, 1, 16)) is None


@pytest.mark.parametrize("override, argument", [
    (dict(w_down=np.ones((3, 8, 12), np.float32)), "w_down"),
    (dict(x=np.ones((4, 9), np.float32)), "x"),
    (dict(sel=np.zeros((4, 2), np.float32)), "sel"),
    (dict(gates=np.ones((4, 3), np.float32)), "gates"),
    (dict(x=np.ones((4, 16), jnp.bfloat16)), "x, w_up and w_down"),
])
def test_invalid_inputs_raise_naming_the_argument(override, argument):
  good = dict(x=np.ones((4, 16), np.float32), sel=np.zeros((4, 2), np.int32),
              gates=np.ones((4, 2), np.float32), w_up=np.ones((3, 16, 8), np.float32),
              w_down=np.ones((3, 8, 16), np.float32))
  kwargs = {**good, **override}
  with pytest.raises(ValueError, match=f"^{argument} "):
    expert_mlp(kwargs["x"], kwargs["sel"], kwargs["gates"], kwargs["w_up"], kwargs["w_down"])


@pytest.mark.parametrize("where", ["token", "expert"])
def test_blocked_nans_reach_only_their_outputs(where):
  """The blocked loop's padding rows read zeros and are dropped when added back: a NaN in one
  token's row reaches only that token's output, one in an expert's weights only the outputs of
  the tokens routed to it (and that expert's own weight gradients)."""
  inputs = {name: np.array(a) for name, a in
            _inputs(Case(300, 2, 8, 16, 16, "random", "float32"), seed=5).items()}
  if where == "token":
    inputs["x"][7, 3] = np.nan
    poisoned = np.arange(300) == 7
  else:
    inputs["w_down"][3, 0, 0] = np.nan
    poisoned = (inputs["sel"] == 3).any(axis=1)
  y, (dx, _, dw_up, _) = _run(inputs, "blocked")
  y, dx = np.asarray(y), np.asarray(dx)
  assert np.isnan(y[poisoned]).any(axis=1).all() and not np.isnan(y[~poisoned]).any()
  if where == "expert":
    assert not np.isnan(dx[~poisoned]).any()
    assert not np.isnan(np.delete(np.asarray(dw_up), 3, axis=0)).any()
