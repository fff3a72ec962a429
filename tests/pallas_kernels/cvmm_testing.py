"""Shared pieces of the cvmm tests: random cases and the float64 numpy oracle (value and VJP)."""

import dataclasses

import jax.numpy as jnp
import numpy as np

IMPLS = ("pallas", "blocked", "ragged", "gather")
# Scale-relative tolerance: max |got - want| <= TOL * max |want|.
TOL = {"float32": 1e-5, "bfloat16": 1e-2}


@dataclasses.dataclass(frozen=True)
class Case:
  """One random cvmm problem. routing: "random", "one_expert" (every slot on expert E - 1)
  or "sparse" (only even expert ids, so the odd ones have no rows)."""
  n: int
  k: int
  experts: int
  m: int
  l: int
  x_per_slot: bool
  gated: bool
  routing: str
  dtype: str

  def __str__(self):
    return (f"N{self.n}-k{self.k}-E{self.experts}-M{self.m}-L{self.l}-"
            f"{'x3d' if self.x_per_slot else 'x2d'}-{'gates' if self.gated else 'nogates'}-"
            f"{self.routing}-{self.dtype}")


# A representative sample of the cross product (N, k, E, M, L, x rank, gates, routing, dtype);
# every value named in issue 3 appears at least once.
CASES = (
    Case(1, 1, 1, 16, 16, False, False, "random", "float32"),
    Case(7, 2, 3, 48, 16, True, True, "random", "float32"),
    Case(64, 4, 16, 16, 48, False, True, "sparse", "float32"),
    Case(300, 2, 16, 128, 48, False, False, "one_expert", "float32"),
    Case(64, 2, 1, 128, 128, False, True, "random", "float32"),
    Case(64, 1, 3, 48, 128, True, False, "random", "bfloat16"),
    Case(300, 4, 3, 16, 128, False, True, "random", "bfloat16"),
    Case(7, 4, 16, 128, 16, True, True, "sparse", "bfloat16"),
)


def make_inputs(case: Case, seed: int = 0):
  """Random x, sel, w, gates (None unless gated) and a cotangent of the output, as numpy.

  Floats are rounded to the case dtype here, so the float64 oracle sees exactly the values the
  implementation sees.
  """
  rng = np.random.default_rng(seed)
  x_shape = (case.n, case.k, case.m) if case.x_per_slot else (case.n, case.m)
  if case.routing == "random":
    sel = rng.integers(0, case.experts, (case.n, case.k))
  elif case.routing == "one_expert":
    sel = np.full((case.n, case.k), case.experts - 1)
  else:
    sel = 2 * rng.integers(0, (case.experts + 1) // 2, (case.n, case.k))
  dtype = jnp.dtype(case.dtype)
  as_dtype = lambda a: np.asarray(jnp.asarray(a, dtype))
  x = as_dtype(rng.standard_normal(x_shape))
  w = as_dtype(rng.standard_normal((case.experts, case.m, case.l)) / np.sqrt(case.m))
  gates = as_dtype(rng.uniform(0.1, 1.0, (case.n, case.k))) if case.gated else None
  y_shape = (case.n, case.l) if case.gated else (case.n, case.k, case.l)
  cotangent = as_dtype(rng.standard_normal(y_shape))
  return x, sel.astype(np.int32), w, gates, cotangent


def _f64(a):
  return None if a is None else np.asarray(a, np.float64)


def _slot_rows(x, k):
  """x as one row per slot: [N, k, M]."""
  return np.repeat(x[:, None, :], k, axis=1) if x.ndim == 2 else x


def oracle(x, sel, w, gates):
  """float64 cvmm: [N, k, L], or [N, L] with gates."""
  x, w, gates = _f64(x), _f64(w), _f64(gates)
  y_nkl = np.einsum("nkm,nkml->nkl", _slot_rows(x, sel.shape[1]), w[sel])
  return y_nkl if gates is None else np.einsum("nk,nkl->nl", gates, y_nkl)


def oracle_vjp(x, sel, w, gates, cotangent):
  """float64 gradients (dx, dw, dgates) of <cvmm(x, sel, w, gates), cotangent>."""
  x, w, gates, ct = _f64(x), _f64(w), _f64(gates), _f64(cotangent)
  k = sel.shape[1]
  x_nkm = _slot_rows(x, k)
  ct_nkl = ct if gates is None else gates[:, :, None] * ct[:, None, :]
  dx_nkm = np.einsum("nkl,nkml->nkm", ct_nkl, w[sel])
  dx = dx_nkm.sum(axis=1) if x.ndim == 2 else dx_nkm
  dw = np.zeros_like(w)
  np.add.at(dw, sel.reshape(-1), np.einsum("sm,sl->sml", x_nkm.reshape(-1, x.shape[-1]),
                                           ct_nkl.reshape(-1, w.shape[-1])))
  dgates = None
  if gates is not None:
    dgates = np.einsum("nl,nkl->nk", ct, np.einsum("nkm,nkml->nkl", x_nkm, w[sel]))
  return dx, dw, dgates


def assert_close(got, want, dtype: str, what: str):
  """max |got - want| <= TOL[dtype] * max |want| (after casting got to float64)."""
  got = np.asarray(jnp.asarray(got, jnp.float32), np.float64)
  assert got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}"
  scale = max(np.abs(want).max(), 1e-30)
  err = np.abs(got - want).max()
  assert err <= TOL[dtype] * scale, f"{what}: max error {err:.3g} > {TOL[dtype]} * {scale:.3g}"
