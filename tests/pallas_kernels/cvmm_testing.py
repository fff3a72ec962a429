"""Shared pieces of the cvmm tests: random cases and the float64 numpy oracle (value and VJP)."""

import dataclasses
import importlib.util

import jax
import jax.numpy as jnp
import numpy as np
import pytest

IMPLS = ("pallas", "blocked", "ragged", "gather")
# Scale-relative tolerance: max |got - want| <= TOL * max |want|. Inputs are exact in their
# dtype (the oracle sees the same values) and products accumulate in f32, so the error is
# mostly the rounding of the output: 2^-24 (f32), 2^-11 (f16), 2^-8 (bf16) relative, with
# headroom for the f32 sums of up to a few hundred terms.
TOL = {"float32": 1e-5, "float16": 2e-3, "bfloat16": 1e-2}


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
    # Token-shared x, which the Pallas kernels read through the sorted index (no copy): k = 1
    # with empty experts, and k = 3 over uneven groups, both with N and N k off the 64-row
    # tile.
    Case(67, 1, 5, 40, 24, False, True, "sparse", "float32"),
    Case(130, 3, 6, 24, 40, False, False, "random", "bfloat16"),
)


# The Hopper kernels take 16-bit inputs with M and L multiples of 64. These cases cover one
# expert, empty experts, k = 1, fewer rows than one 128-row tile, row counts that are not a
# multiple of it, x per slot, and the sigma-MoE up and down projection shapes.
MOSAIC_CASES = (
    Case(7, 1, 3, 64, 64, False, False, "random", "bfloat16"),
    Case(300, 4, 16, 128, 192, False, True, "sparse", "bfloat16"),
    Case(300, 2, 5, 192, 128, True, True, "one_expert", "bfloat16"),
    Case(1000, 4, 32, 512, 128, False, False, "random", "bfloat16"),
    Case(1000, 4, 32, 128, 512, True, True, "random", "bfloat16"),
    Case(130, 2, 4, 128, 64, False, True, "random", "float16"),
)

_ON_GPU = jax.default_backend() == "gpu"
_HAS_TOKAMAX = importlib.util.find_spec("tokamax") is not None


def impl_cases() -> list:
  """(case, impl) test parameters: the CPU impls on CASES; megablox (in interpret mode off
  TPU; its kernels have their own tests in test_megablox.py) on every other case; "mosaic" on
  MOSAIC_CASES, run on a GPU only (wgmma and TMA have no interpret mode); "tokamax" on CASES
  when installed."""
  params = [pytest.param(case, impl, id=f"{impl}-{case}") for impl in IMPLS for case in CASES]
  params += [pytest.param(case, "megablox", id=f"megablox-{case}") for case in CASES[::2]]
  on_gpu = pytest.mark.skipif(not _ON_GPU, reason="Mosaic GPU kernels need a GPU")
  params += [pytest.param(case, "mosaic", id=f"mosaic-{case}", marks=on_gpu)
             for case in MOSAIC_CASES]
  installed = pytest.mark.skipif(not _HAS_TOKAMAX, reason="tokamax is not installed")
  params += [pytest.param(case, "tokamax", id=f"tokamax-{case}", marks=installed)
             for case in CASES]
  return params


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
