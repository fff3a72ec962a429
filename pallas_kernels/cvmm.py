"""`cvmm`: the grouped expert matmul of sigma-MoE (App. B.1 of the paper), with its VJP.

    y = cvmm(x, sel, w, gates=None, *, impl="auto")
    x [N, M] (one row per token, shared by its k slots) or [N, k, M] (one row per slot)
    sel [N, k] int expert ids, w [E, M, L]
    gates None  -> y [N, k, L],  y[n, j] = x[n (, j)] @ w[sel[n, j]]
    gates [N, k] -> y [N, L]  =  sum_j gates[n, j] * x[n (, j)] @ w[sel[n, j]]

Every impl but the gather oracle shares one `jax.custom_vjp` and differs only in its
backend (`backends.py`: the layout of the slots as rows grouped by expert, the grouped
matmul, the weight gradient). The layout is built once in the forward pass and is a residual
of the backward pass, which is

    dx   = (dy  @ w[e]^T)  summed over the k slots of a token when x is shared
    dw_e = x_e^T @ (g * dy)_e
    dg   = <dy[n], x[n, j] @ w[e]>  =  <dy[n] @ w[e]^T, x[n, j]>

The last identity makes the gate gradient exact without keeping the ungated products: it
reuses the input-gradient matmul, computed on the ungated dy and scaled by g afterwards; the
inner product is taken in token order (dy @ w^T gathered back to slots, against x[n]), so it
needs no copy of x in expert order either.

The rows of x and of the cotangent enter the kernels in the form the backend asks for
(`Backend.token_rows` / `slot_rows`): on "pallas" the kernels load them through the sorted
index (the gated weight gradient's rows g * dy with each row's gate applied as it is loaded),
so neither pass copies x or dy into an [N*k, ...] array in expert order; the other backends
get those copies, gathered in XLA.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np

from pallas_kernels import backends
from pallas_kernels import gather_oracle
from pallas_kernels import slot_layout


def _layout_x_rows(backend, x: jax.Array, layout: slot_layout.SlotLayout, k: int):
  """x's rows in expert order, as the backend takes them (an array, or `IndexedRows`)."""
  if x.ndim == 2:
    return backend.token_rows(x, layout, k)
  return backend.slot_rows(x.reshape(-1, x.shape[-1]), layout)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _grouped_cvmm(backend, x, sel_nk, w_eml, gates_nk):
  y, _ = _grouped_cvmm_fwd(backend, x, sel_nk, w_eml, gates_nk)
  return y


def _grouped_cvmm_fwd(backend, x, sel_nk, w_eml, gates_nk):
  n, k = sel_nk.shape
  num_experts, _, size_l = w_eml.shape
  layout = backend.make_layout(sel_nk.reshape(-1), num_experts)
  x_rm = _layout_x_rows(backend, x, layout, k)
  z_dtype = x.dtype if gates_nk is None else jnp.float32
  z_rl = backend.matmul(layout, x_rm, w_eml, transpose=False, out_dtype=z_dtype)
  z_nkl = jnp.take(z_rl, layout.slot_row_s, axis=0).reshape(n, k, size_l)
  if gates_nk is None:
    y = z_nkl
  else:
    # A broadcast multiply and sum, not an einsum: XLA fuses it with the gather of z, while
    # "nk,nkl->nl" would become N tiny batched matmuls.
    y = jnp.sum(gates_nk.astype(jnp.float32)[:, :, None] * z_nkl, axis=1).astype(x.dtype)
  return y, (x, w_eml, gates_nk, layout)


def _grouped_cvmm_bwd(backend, residuals, dy):
  x, w_eml, gates_nk, layout = residuals
  num_experts, size_m, size_l = w_eml.shape
  num_slots = layout.slot_row_s.shape[0]
  n = x.shape[0]
  k = num_slots // n
  dy = dy.astype(x.dtype)
  if gates_nk is None:
    dy_rl = backend.slot_rows(dy.reshape(num_slots, size_l), layout)
  else:
    dy_rl = backend.token_rows(dy, layout, k)
  u_rm = backend.matmul(layout, dy_rl, w_eml, transpose=True, out_dtype=jnp.float32)
  u_nkm = jnp.take(u_rm, layout.slot_row_s, axis=0).reshape(n, k, size_m)
  dgates_nk = None
  if gates_nk is not None:
    g_nk = gates_nk.astype(jnp.float32)
    x_nkm = x[:, None, :] if x.ndim == 2 else x
    dgates_nk = jnp.sum(u_nkm * x_nkm.astype(jnp.float32), axis=-1).astype(gates_nk.dtype)
    u_nkm = u_nkm * g_nk[:, :, None]
    # The weight gradient takes the gated cotangent rows g * dy.
    g_r = slot_layout.rows_from_slots(g_nk.reshape(-1), layout)
    dy_rl = backend.token_rows(dy, layout, k, scale_r=g_r)
  dx = (u_nkm.sum(axis=1) if x.ndim == 2 else u_nkm).astype(x.dtype)
  dw_eml = backend.weight_grad(layout, _layout_x_rows(backend, x, layout, k), dy_rl,
                               num_experts=num_experts, out_dtype=w_eml.dtype)
  return dx, None, dw_eml, dgates_nk


_grouped_cvmm.defvjp(_grouped_cvmm_fwd, _grouped_cvmm_bwd)


def _check_inputs(x, sel, w, gates) -> None:
  """Raise a ValueError naming the offending argument if the call breaks the contract."""
  if w.ndim != 3:
    raise ValueError(f"w must have shape [E, M, L], got shape {w.shape}")
  if sel.ndim != 2 or not jnp.issubdtype(sel.dtype, jnp.integer):
    raise ValueError(f"sel must be an integer array [N, k], got {sel.dtype} {sel.shape}")
  n, k = sel.shape
  num_experts, size_m, _ = w.shape
  if num_experts < 1:
    raise ValueError(f"w must hold at least one expert, got shape {w.shape}")
  expected_x = [(n, size_m), (n, k, size_m)]
  if x.shape not in expected_x:
    raise ValueError(f"x must have shape [N, M] = {expected_x[0]} or [N, k, M] = "
                     f"{expected_x[1]} (from sel {sel.shape} and w {w.shape}), got {x.shape}")
  if not jnp.issubdtype(x.dtype, jnp.floating):
    raise ValueError(f"x must be a floating array, got {x.dtype}")
  if w.dtype != x.dtype:
    raise ValueError(f"w must have the dtype of x ({x.dtype}), got {w.dtype}")
  if not isinstance(sel, jax.core.Tracer):  # Concrete ids (eager calls) are checked; traced
    ids = np.asarray(sel)  # ones are clipped.
    lo, hi = int(ids.min(initial=0)), int(ids.max(initial=0))
    if lo < 0 or hi >= num_experts:
      raise ValueError(f"sel must hold expert ids in [0, {num_experts}) for w {w.shape}, got "
                       f"ids from {lo} to {hi}")
  if gates is not None:
    if gates.shape != sel.shape:
      raise ValueError(f"gates must have the shape of sel {sel.shape}, got {gates.shape}")
    if not jnp.issubdtype(gates.dtype, jnp.floating):
      raise ValueError(f"gates must be a floating array, got {gates.dtype}")


def cvmm(x: jax.Array, sel: jax.Array, w: jax.Array, gates: jax.Array | None = None, *,
         impl: str = "auto") -> jax.Array:
  """Conditional vector-matrix multiplication: each token slot times its expert's matrix.

  Args:
    x: [N, M] token rows shared by their k slots, or [N, k, M] one row per slot.
    sel: [N, k] integer expert ids in [0, E). Concrete ids outside raise ValueError; under
      jit (traced ids) they are clipped into [0, E), as indexing would, by every impl.
    w: [E, M, L] expert weights, same dtype as x (float32 or bfloat16).
    gates: optional [N, k] weights of the k slots, summed into one output row per token.
    impl: "pallas" (Triton kernels on GPU, interpret mode elsewhere), "mosaic" (Mosaic GPU
      kernels for Hopper; 16-bit dtypes, M and L multiples of 64), "megablox" (Pallas TPU
      grouped matmul; interpret mode off TPU), "blocked" (padded blocks + batched matmul in
      XLA), "ragged" (jax.lax.ragged_dot), "tokamax" (tokamax.ragged_dot, if installed),
      "gather" (the w[sel] oracle) or "auto" (pallas on GPU, megablox on TPU, blocked
      elsewhere).

  Returns:
    [N, k, L] without gates, [N, L] with gates, in the dtype of x (f32 accumulation).
    Differentiable in x, w and gates. Non-finite values stay where they belong: a NaN in
    token n's row of x reaches only token n's outputs, and one in expert e's weights only the
    slots routed to e (nothing is checked for NaN, which would cost a sync). Exception:
    "ragged" on CPU, whose `ragged_dot` lowering multiplies every row by every expert,
    spreads a NaN weight w[e, m, l] to output column l of every token.

  Example:
    Two tokens, each sent to two of three experts; a slot's row is the token times its
    expert's matrix, and gates sum a token's slots:

    >>> from pallas_kernels import cvmm
    >>> x = jnp.arange(8.0).reshape(2, 4)
    >>> sel = jnp.array([[0, 2], [1, 2]])
    >>> w = jax.random.normal(jax.random.key(0), (3, 4, 5))
    >>> y = cvmm(x, sel, w)
    >>> y.shape
    (2, 2, 5)
    >>> bool(jnp.allclose(y[1, 0], x[1] @ w[1], atol=1e-4))
    True
    >>> gates = jnp.array([[0.5, 0.5], [1.0, 0.0]])
    >>> bool(jnp.allclose(cvmm(x, sel, w, gates)[0], 0.5 * x[0] @ (w[0] + w[2]), atol=1e-4))
    True
  """
  backends.check_impl(impl)
  _check_inputs(x, sel, w, gates)
  impl = backends.resolve(impl, x.dtype, w.shape)
  sel = jnp.clip(sel, 0, w.shape[0] - 1).astype(jnp.int32)
  if impl == "gather" or sel.size == 0:
    return gather_oracle.cvmm_gather(x, sel, w, gates)
  return _grouped_cvmm(backends.backend(impl), x, sel, w, gates)
