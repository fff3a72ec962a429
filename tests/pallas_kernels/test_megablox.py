"""The megablox backend (TPU) against float64 numpy, in Pallas interpret mode on CPU, and its
TPU lowering (Mosaic's block-shape rules) checked on CPU."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from cvmm_testing import assert_close
from pallas_kernels import megablox
from pallas_kernels import slot_layout

_matmul = jax.jit(megablox.matmul, static_argnames=("transpose", "out_dtype", "interpret"))
_weight_grad = jax.jit(megablox.weight_grad,
                       static_argnames=("num_experts", "out_dtype", "interpret"))


@dataclasses.dataclass(frozen=True)
class Case:
  """R sorted rows over E experts, w [E, M, L]. routing: "random", or "sparse" (odd expert
  ids only, so expert 0, the even ones and with odd E the last one have no rows)."""
  rows: int
  experts: int
  m: int
  l: int
  routing: str
  dtype: str

  def __str__(self):
    return f"R{self.rows}-E{self.experts}-M{self.m}-L{self.l}-{self.routing}-{self.dtype}"


# Odd sizes everywhere: 37 rows pad to one 48-row tile, 300 rows to three 128-row tiles with
# experts starting inside tiles; M and L fill part of one 128- or 256-wide tile (M 200 and
# L 130 under 256), where interpret mode's NaN reads past the edge would show any leak.
CASES = (
    Case(37, 4, 48, 16, "random", "float32"),
    Case(300, 6, 200, 130, "sparse", "float32"),
    Case(37, 1, 48, 16, "random", "bfloat16"),
    Case(300, 5, 48, 16, "sparse", "bfloat16"),
)


def _inputs(case: Case, seed: int = 0):
  """sel [R], x [R, M], w [E, M, L], dy [R, L] as numpy, floats exact in the case dtype."""
  rng = np.random.default_rng(seed)
  if case.routing == "random":
    sel = rng.integers(0, case.experts, case.rows)
  else:
    sel = 2 * rng.integers(0, case.experts // 2, case.rows) + 1
  as_dtype = lambda a: np.asarray(jnp.asarray(a, case.dtype))
  x = as_dtype(rng.standard_normal((case.rows, case.m)))
  w = as_dtype(rng.standard_normal((case.experts, case.m, case.l)) / np.sqrt(case.m))
  dy = as_dtype(rng.standard_normal((case.rows, case.l)))
  return sel.astype(np.int32), x, w, dy


def _expert_rows(sel):
  """Expert of each sorted row: the layout's rows are the slots in expert order."""
  return np.sort(sel)


def _reference_matmul(sel, x, w, transpose):
  """float64 x[r] @ w[e(r)] (or @ w[e(r)]^T), one einsum per expert."""
  expert_r = _expert_rows(sel)
  w = np.asarray(w, np.float64)
  y = np.zeros((x.shape[0], w.shape[1] if transpose else w.shape[2]))
  for e in range(w.shape[0]):
    rows = expert_r == e
    y[rows] = np.einsum("rl,ml->rm" if transpose else "rm,ml->rl",
                        np.asarray(x[rows], np.float64), w[e])
  return y


def _reference_weight_grad(sel, x, dy, num_experts):
  """float64 dw[e] = x_e^T @ dy_e, one einsum per expert (zeros for empty experts)."""
  expert_r = _expert_rows(sel)
  dw = np.zeros((num_experts, x.shape[1], dy.shape[1]))
  for e in range(num_experts):
    rows = expert_r == e
    dw[e] = np.einsum("rm,rl->ml", np.asarray(x[rows], np.float64),
                      np.asarray(dy[rows], np.float64))
  return dw


@pytest.mark.parametrize("transpose", [False, True], ids=["x_w", "dy_wT"])
@pytest.mark.parametrize("case", CASES, ids=str)
def test_matmul_matches_float64(case, transpose):
  sel, x, w, dy = _inputs(case)
  layout = slot_layout.sorted_layout(jnp.asarray(sel), case.experts)
  lhs = dy if transpose else x
  # The dtypes cvmm asks for: its own dtype forward, float32 for the input gradient.
  out_dtype = jnp.float32 if transpose else jnp.dtype(case.dtype)
  y = _matmul(layout, lhs, w, transpose=transpose, out_dtype=out_dtype, interpret=True)
  assert y.dtype == out_dtype
  assert_close(y, _reference_matmul(sel, lhs, w, transpose), case.dtype, "megablox matmul")


@pytest.mark.parametrize("case", CASES, ids=str)
def test_weight_grad_matches_float64(case):
  sel, x, w, dy = _inputs(case)
  layout = slot_layout.sorted_layout(jnp.asarray(sel), case.experts)
  dw = _weight_grad(layout, x, dy, num_experts=case.experts, out_dtype=jnp.dtype(case.dtype),
                    interpret=True)
  assert dw.dtype == jnp.dtype(case.dtype)
  assert_close(dw, _reference_weight_grad(sel, x, dy, case.experts), case.dtype,
               "megablox weight_grad")


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_lowers_for_tpu(dtype):
  """The Mosaic lowering accepts our tiles (block-shape rules, scalar prefetch) and f32
  dots are traced at HIGHEST precision; compiling needs a TPU."""
  case = Case(37, 4, 48, 16, "random", dtype)

  def both_kernels(sel, x, w, dy):
    layout = slot_layout.sorted_layout(sel, case.experts)
    return (megablox.matmul(layout, dy, w, transpose=True, out_dtype=jnp.float32,
                            interpret=False),
            megablox.weight_grad(layout, x, dy, num_experts=case.experts, out_dtype=x.dtype,
                                 interpret=False))

  args = tuple(jnp.asarray(a) for a in _inputs(case))
  lowered = jax.jit(both_kernels).trace(*args).lower(lowering_platforms=("tpu",))
  assert lowered.as_text().count("tpu_custom_call") == 2
  jaxpr = str(jax.make_jaxpr(both_kernels)(*args))
  dots = jaxpr.count("dot_general[")
  highest = jaxpr.count("precision=(Precision.HIGHEST, Precision.HIGHEST)")
  assert dots > 0 and highest == (dots if dtype == "float32" else 0)
