"""The row gather inside the Pallas Triton kernels' loads (issue 59), in interpret mode.

Given a row operand as `slot_layout.IndexedRows`, the kernels read its row r as
source[index[r]] (times scale[r] if given): here against the same kernels on the copy
`slot_layout.materialize` makes (bit for bit: the tiles hold the same values) and against
float64 numpy, with padding indices (past the source: zero rows), empty experts and row counts
off the tile. Then the point of it: traced for value and gradients, `cvmm` and `expert_mlp` on
"pallas" contain no gather of a token-shared [N, d] array (x, or the cotangent of a gated sum)
into [N*k, d] rows, while a backend that does not gather in its kernels still makes that copy,
as the Triton backend did before. (The values and gradients of both ops through this path are
checked against float64 in test_cvmm_numerics.py and test_expert_mlp.py.)
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.extend import core as jex_core

from cvmm_testing import assert_close
from pallas_kernels import backends, cvmm, expert_mlp, slot_layout
from pallas_kernels import triton_matmul, triton_weight_grad

_SMALL_MATMUL = triton_matmul.MatmulBlocks(rows=16, cols=16, inner=16)
_SMALL_WGRAD = triton_weight_grad.WeightGradBlocks(rows_m=16, cols=16, inner=16)


def _problem(n, k, experts, m, l, dtype, seed):
  """Token rows x [N, M], w [E, M, L], dy rows [S, L] and a sorted layout of random ids over
  half of the experts (the rest empty), with every 7th row's index set past N (padding)."""
  rng = np.random.default_rng(seed)
  used = rng.permutation(experts)[:max(1, experts // 2)]
  sel_s = rng.choice(used, n * k).astype(np.int32)
  as_dtype = lambda a: np.asarray(jnp.asarray(a, dtype))
  x_nm = as_dtype(rng.standard_normal((n, m)))
  w_eml = as_dtype(rng.standard_normal((experts, m, l)) / np.sqrt(m))
  dy_sl = as_dtype(rng.standard_normal((n * k, l)))
  layout = slot_layout.sorted_layout(jnp.asarray(sel_s), experts)
  index_r = np.array(slot_layout.token_rows_index(layout, k))
  index_r[::7] = n + np.arange(len(index_r[::7]))  # Padding rows: out of x's range.
  return x_nm, w_eml, dy_sl, layout, index_r, np.asarray(sel_s)[np.asarray(layout.row_slot_r)]


def _rows(source, index_r, scale_r=None):
  """float64 source[index] (times scale) with zero rows for indices past the source."""
  padded = np.concatenate([np.float64(source), np.zeros((1, source.shape[1]))])
  rows = padded[np.minimum(index_r, len(source))]
  return rows if scale_r is None else rows * np.float64(scale_r)[:, None]


def _copy(rows: slot_layout.IndexedRows) -> jax.Array:
  """The rows as the backends without the in-kernel gather get them."""
  return slot_layout.materialize(rows)


_SHAPES = [(37, 3, 5, 40, 24, "float32"), (70, 1, 4, 24, 48, "bfloat16"),
           (5, 4, 9, 16, 16, "float32")]


@pytest.mark.parametrize("n, k, experts, m, l, dtype", _SHAPES)
@pytest.mark.parametrize("blocks", [None, _SMALL_MATMUL], ids=["default_blocks", "16x16x16"])
@pytest.mark.parametrize("scaled", [False, True], ids=["unscaled", "scaled"])
def test_segment_matmul_loads_rows_through_the_index(n, k, experts, m, l, dtype, blocks,
                                                     scaled):
  x_nm, w_eml, _, layout, index_r, expert_r = _problem(n, k, experts, m, l, dtype, seed=n)
  scale_r = np.random.default_rng(1).uniform(0.1, 1, len(index_r)).astype(np.float32)
  rows = slot_layout.IndexedRows(jnp.asarray(x_nm), jnp.asarray(index_r),
                                 jnp.asarray(scale_r) if scaled else None)
  run = lambda x: triton_matmul.segment_matmul(x, w_eml, layout.groups, out_dtype=jnp.float32,
                                               interpret=True, blocks=blocks)
  got = run(rows)
  copy = _copy(rows)
  np.testing.assert_array_equal(got, run(copy))
  want = np.einsum("rm,rml->rl", np.float64(copy), np.float64(w_eml)[expert_r])
  assert_close(got, want, dtype, "out")
  assert_close(copy, _rows(x_nm, index_r, scale_r if scaled else None), dtype, "rows")
  assert not np.any(np.asarray(got)[index_r >= n]), "padding rows must read zeros"


@pytest.mark.parametrize("n, k, experts, m, l, dtype", _SHAPES)
@pytest.mark.parametrize("gathered", ["x", "dy", "both", "both_dy_scaled"])
def test_weight_grad_loads_rows_through_the_index(n, k, experts, m, l, dtype, gathered):
  x_nm, _, dy_sl, layout, x_index, expert_r = _problem(n, k, experts, m, l, dtype, seed=n + 1)
  dy_scale = None
  if gathered == "both_dy_scaled":
    dy_scale = jnp.asarray(np.random.default_rng(2).uniform(0.1, 1, len(x_index)), jnp.float32)
  x_rows = slot_layout.IndexedRows(jnp.asarray(x_nm), jnp.asarray(x_index))
  dy_rows = slot_layout.IndexedRows(jnp.asarray(dy_sl), layout.row_slot_r, dy_scale)
  x_arg = _copy(x_rows) if gathered == "dy" else x_rows
  dy_arg = _copy(dy_rows) if gathered == "x" else dy_rows
  run = lambda x, dy: triton_weight_grad.weight_grad(x, dy, layout.groups, out_dtype=jnp.float32,
                                                     interpret=True, blocks=_SMALL_WGRAD)
  got = run(x_arg, dy_arg)
  np.testing.assert_array_equal(got, run(_copy(x_rows), _copy(dy_rows)))
  want = np.zeros((experts, m, l))
  np.add.at(want, expert_r, np.einsum("rm,rl->rml", np.float64(_copy(x_rows)),
                                      np.float64(_copy(dy_rows))))
  assert_close(got, want, dtype, "dw")
  assert not np.any(np.asarray(got)[np.setdiff1d(np.arange(experts), expert_r)])


def _sub_jaxprs(params):
  for value in params.values():
    for item in value if isinstance(value, (list, tuple)) else (value,):
      if isinstance(item, jex_core.ClosedJaxpr):
        yield item.jaxpr
      elif isinstance(item, jex_core.Jaxpr):
        yield item


def _gathers(jaxpr):
  """(operand shape, result shape) of every gather in the jaxpr and the jaxprs inside it."""
  for eqn in jaxpr.eqns:
    if eqn.primitive.name == "gather":
      yield eqn.invars[0].aval.shape, eqn.outvars[0].aval.shape
    for sub in _sub_jaxprs(eqn.params):
      yield from _gathers(sub)


N, K, E, D, G = 37, 3, 5, 24, 16


def _token_row_copies(op: str, impl: str, k: int = K) -> list:
  """The gathers of a token-shared [N, width] array into [N k, width] rows in the jaxpr of
  the op's value and gradients: x, and the cotangents of the gated sums (cvmm with gates,
  expert_mlp), whose rows are read the same way."""
  rng = np.random.default_rng(0)
  x = jnp.asarray(rng.standard_normal((N, D)), jnp.float32)
  sel = jnp.asarray(rng.integers(0, E, (N, k)), jnp.int32)
  gates = jnp.asarray(rng.uniform(0.1, 1, (N, k)), jnp.float32)
  w_up, w_down = jnp.ones((E, D, G)), jnp.ones((E, G, D))
  if op == "cvmm":
    loss = lambda x, gates, w_up, w_down: jnp.sum(cvmm(x, sel, w_up, impl=impl) ** 2)
  elif op == "cvmm_gated":
    loss = lambda x, gates, w_up, w_down: jnp.sum(cvmm(x, sel, w_up, gates, impl=impl) ** 2)
  else:
    loss = lambda x, gates, w_up, w_down: jnp.sum(expert_mlp(
        x, sel, gates, w_up, w_down, impl=impl, dropout_rate=0.1,
        dropout_key=jax.random.key(0)) ** 2)
  traced = jax.make_jaxpr(jax.value_and_grad(loss, argnums=(0, 1, 2, 3)))(x, gates, w_up,
                                                                          w_down)
  return [(operand, result) for operand, result in _gathers(traced.jaxpr)
          if len(operand) == 2 and operand[0] == N and result == (N * k, operand[1])]


_OPS = ["cvmm", "cvmm_gated", "expert_mlp"]


@pytest.mark.parametrize("k", [2, K])
@pytest.mark.parametrize("op", _OPS)
def test_pallas_never_copies_token_rows_into_slot_order(op, k):
  assert backends.backend("pallas").gathers_rows
  assert not _token_row_copies(op, "pallas", k)


@pytest.mark.parametrize("op", _OPS)
def test_a_backend_without_the_gather_still_copies_them(op, monkeypatch):
  """What the check above would have found before: the same Triton kernels told not to
  gather (as every backend but the Triton one still is) get x copied into slot order in the
  forward pass and again in the backward pass, and the gated sums' cotangent too."""
  triton = backends.backend("pallas")  # compiled on a GPU, interpret mode elsewhere
  name = next(key for key, value in backends._BACKENDS.items() if value is triton)
  monkeypatch.setitem(backends._BACKENDS, name, dataclasses.replace(triton, gathers_rows=False))
  copies = 2 if op == "cvmm" else 3
  assert len(_token_row_copies(op, "pallas")) >= copies
  assert len(_token_row_copies(op, "ragged")) >= copies
  assert not backends.backend("ragged").gathers_rows
