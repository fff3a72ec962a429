"""cvmm values and gradients (x, w, gates) of every impl against the float64 oracle; jit, scan."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pallas_kernels import cvmm
from cvmm_testing import assert_close, impl_cases, make_inputs, oracle, oracle_vjp


def _vjp(x, sel, w, gates, cotangent, impl):
  """cvmm(...) and the gradients of <cvmm(...), cotangent> with respect to x, w and (when
  given) gates."""
  y, pullback = jax.vjp(lambda x, w, gates: cvmm(x, sel, w, gates, impl=impl), x, w, gates)
  return y, pullback(cotangent)


_vjp_jit = jax.jit(_vjp, static_argnames="impl")


@pytest.mark.parametrize("case, impl", impl_cases())
def test_values_and_gradients_match_float64_oracle(case, impl):
  x, sel, w, gates, cotangent = make_inputs(case, seed=1)
  y, (dx, dw, dgates) = _vjp_jit(x, sel, w, gates, cotangent, impl=impl)
  assert y.dtype == jnp.dtype(case.dtype)
  assert_close(y, oracle(x, sel, w, gates), case.dtype, f"{impl} y")
  want_dx, want_dw, want_dgates = oracle_vjp(x, sel, w, gates, cotangent)
  assert dx.dtype == x.dtype and dw.dtype == w.dtype
  assert_close(dx, want_dx, case.dtype, f"{impl} dx")
  assert_close(dw, want_dw, case.dtype, f"{impl} dw")
  unused = np.setdiff1d(np.arange(case.experts), sel)
  assert not np.any(np.asarray(dw)[unused]), "experts without rows must get a zero gradient"
  if case.gated:
    assert_close(dgates, want_dgates, case.dtype, f"{impl} dgates")
  else:
    assert dgates is None


def _stack_of_layers(impl):
  """A jitted loss over layers applied with lax.scan: h <- h + cvmm(h, sel_l, w_l, gates_l)."""
  def loss(h_nm, sel_lnk, w_lemm, gates_lnk):
    def layer(h, params):
      sel, w, gates = params
      return h + cvmm(h, sel, w, gates, impl=impl), None
    h_nm, _ = jax.lax.scan(layer, h_nm, (sel_lnk, w_lemm, gates_lnk))
    return jnp.sum(h_nm ** 2), h_nm
  return jax.jit(jax.value_and_grad(loss, argnums=(0, 2, 3), has_aux=True))


@pytest.mark.parametrize("impl", ["pallas", "blocked", "ragged"])
def test_scan_over_layers_under_jit(impl):
  n, k, experts, m, layers = 20, 2, 5, 16, 3
  rng = np.random.default_rng(2)
  h = rng.standard_normal((n, m)).astype(np.float32)
  sel = rng.integers(0, experts, (layers, n, k)).astype(np.int32)
  w = (rng.standard_normal((layers, experts, m, m)) / 4).astype(np.float32)
  gates = rng.uniform(0.1, 1, (layers, n, k)).astype(np.float32)

  (_, h_out), grads = _stack_of_layers(impl)(h, sel, w, gates)
  want = np.float64(h)
  for layer in range(layers):
    want = want + oracle(want, sel[layer], w[layer], gates[layer])
  assert_close(h_out, want, "float32", f"{impl} scan output")
  (_, _), want_grads = _stack_of_layers("gather")(h, sel, w, gates)
  for got, ref, name in zip(grads, want_grads, ("dh", "dw", "dgates")):
    assert_close(got, np.float64(ref), "float32", f"{impl} scan {name}")
