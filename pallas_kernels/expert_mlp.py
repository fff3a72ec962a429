"""`expert_mlp`: a whole MoE feed-forward in expert order, with one layout per call.

    y[n] = sum_j g[n, j] * dropout(act(x[n] @ w_up[e])) @ w_down[e],   e = sel[n, j]

(sigma-MoE Eq. 11.) Two `cvmm` calls would each sort the slots, gather token rows into
their own layout and scatter back, and the hidden activations would leave expert order
between the projections. Here the N*k slots are sorted once and x is gathered into expert
order once; the up projection, the activation, the hidden dropout, the gate and the down
projection all run on those rows; one gather-sum brings them back to tokens. The backward
pass reuses the layout and the pre-activations h (R x G, a quarter of the rows' d_model
width at the paper's sizes):

    z_r  = (g_r a_r) @ w_down[e]          the gate scales the G hidden units, not d_model outputs
    da_r = dy_r @ w_down[e]^T             (ungated)
    dg_r = <da_r, a_r>                    dw_down[e] = sum_r (g_r a_r)^T dy_r
    dh_r = act'(h_r) * drop(g_r da_r)     dx_r = dh_r @ w_up[e]^T,  dw_up[e] = sum_r x_r^T dh_r

Every impl of `backends` runs through it; "gather" is the oracle (`gather_oracle`). The
"blocked" impl (CPUs) runs the same steps block by block in one loop per pass (below).

The token-shared arrays (x in the forward; x and dy in the backward) reach the kernels in the
form the backend asks for (`Backend.token_rows`): on "pallas" they stay [N, d] and the up
projection, the down projection's input gradient and both weight gradients load their rows
through the sorted index (ScatterMoE's gather in the loads, see `triton_matmul`), so no
[N*k, d] copy of x or dy in expert order is made; other backends get those copies from XLA.
The [R, d] outputs of the down projection and of the up projection's input gradient are
still formed and gathered back to tokens, in the compute dtype (the authors' CVMM returns
its products in bf16 under autocast too), then summed over the k slots in f32: in bf16, half
the bytes of f32 rows (the fwd+bwd temporaries at T 32768, d 1024, G 128, K 4, N_E 128
compiled for an H100: 0.56 -> 0.31 GiB) for a larger rounding error (up to 5.4e-3 of the
largest value against float64 at K 4, from 3.6e-3; the bf16 tolerance is 1e-2).
"""

import functools
from typing import Callable

import jax
import jax.numpy as jnp
from jax import lax

from pallas_kernels import backends
from pallas_kernels import blocked
from pallas_kernels import gather_oracle
from pallas_kernels import slot_layout


def dropout_keep_mask(key: jax.Array | None, rate: float, shape) -> jax.Array | None:
  """Which hidden units of each slot survive dropout ([N, k, G] bool), drawn as
  `nnx.Dropout` draws its mask; None when nothing is dropped (no key or rate 0)."""
  if key is None or rate == 0.0:
    return None
  return jax.random.bernoulli(key, p=max(0.0, 1.0 - rate), shape=shape)


def _dropout(a, keep, rate: float):
  """Inverted dropout with a given keep mask (None: identity)."""
  if keep is None:
    return a
  return jnp.where(keep, a / jnp.asarray(1.0 - rate, a.dtype), jnp.zeros((), a.dtype))


def _to_tokens(z_r, layout, n: int, k: int):
  """[R, D] rows -> [N, D] f32: the sum over each token's k slot rows."""
  return jnp.take(z_r, layout.slot_row_s, axis=0).reshape(n, k, -1).astype(jnp.float32).sum(1)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1, 2))
def _fused(backend, activation, rate, x_nd, sel_nk, gates_nk, w_up_edg, w_down_egd, keep_nkg):
  y, _ = _fused_fwd(backend, activation, rate, x_nd, sel_nk, gates_nk, w_up_edg, w_down_egd,
                    keep_nkg)
  return y


def _hidden(activation, rate, h_rg, keep_rg, g_r):
  """The dropped-out activation a_r and the gated rows g_r a_r fed to the down projection."""
  a_rg = _dropout(activation(h_rg), keep_rg, rate)
  return a_rg, (a_rg.astype(jnp.float32) * g_r[:, None]).astype(h_rg.dtype)


def _keep_rows(keep_nkg, layout):
  return None if keep_nkg is None else slot_layout.rows_from_slots(
      keep_nkg.reshape(-1, keep_nkg.shape[-1]), layout)


def _fused_fwd(backend, activation, rate, x_nd, sel_nk, gates_nk, w_up_edg, w_down_egd,
               keep_nkg):
  n, k = sel_nk.shape
  layout = backend.make_layout(sel_nk.reshape(-1), w_up_edg.shape[0])
  x_rd = backend.token_rows(x_nd, layout, k)
  h_rg = backend.matmul(layout, x_rd, w_up_edg, transpose=False, out_dtype=x_nd.dtype)
  g_r = slot_layout.rows_from_slots(gates_nk.reshape(-1).astype(jnp.float32), layout)
  _, ga_rg = _hidden(activation, rate, h_rg, _keep_rows(keep_nkg, layout), g_r)
  z_rd = backend.matmul(layout, ga_rg, w_down_egd, transpose=False, out_dtype=x_nd.dtype)
  y_nd = _to_tokens(z_rd, layout, n, k).astype(x_nd.dtype)
  return y_nd, (x_nd, gates_nk, w_up_edg, w_down_egd, keep_nkg, layout, h_rg)


def _fused_bwd(backend, activation, rate, residuals, dy_nd):
  x_nd, gates_nk, w_up_edg, w_down_egd, keep_nkg, layout, h_rg = residuals
  n, k = gates_nk.shape
  num_experts = w_up_edg.shape[0]
  keep_rg = _keep_rows(keep_nkg, layout)
  g_r = slot_layout.rows_from_slots(gates_nk.reshape(-1).astype(jnp.float32), layout)
  a_rg, ga_rg = _hidden(activation, rate, h_rg, keep_rg, g_r)
  dy_rd = backend.token_rows(dy_nd.astype(x_nd.dtype), layout, k)

  da_rg = backend.matmul(layout, dy_rd, w_down_egd, transpose=True, out_dtype=jnp.float32)
  dg_r = jnp.sum(da_rg * a_rg.astype(jnp.float32), axis=-1)
  dgates_nk = jnp.take(dg_r, layout.slot_row_s).reshape(n, k).astype(gates_nk.dtype)
  dw_down = backend.weight_grad(layout, ga_rg, dy_rd, num_experts=num_experts,
                                out_dtype=w_down_egd.dtype)

  _, activation_vjp = jax.vjp(activation, h_rg.astype(jnp.float32))
  dh_rg, = activation_vjp(_dropout(da_rg * g_r[:, None], keep_rg, rate))
  dh_rg = dh_rg.astype(x_nd.dtype)
  dx_rd = backend.matmul(layout, dh_rg, w_up_edg, transpose=True, out_dtype=x_nd.dtype)
  dx_nd = _to_tokens(dx_rd, layout, n, k).astype(x_nd.dtype)
  x_rd = backend.token_rows(x_nd, layout, k)
  dw_up = backend.weight_grad(layout, x_rd, dh_rg, num_experts=num_experts,
                              out_dtype=w_up_edg.dtype)
  return dx_nd, None, dgates_nk, dw_up, dw_down, None


_fused.defvjp(_fused_fwd, _fused_bwd)


# impl "blocked": the whole layer as one loop over row blocks (the CPU path).
#
# The generic path above runs each projection as its own loop over the blocked layout and moves
# whole [R, d_model] arrays between them: the token rows gathered into expert order, the down
# projection's rows gathered back and summed, and in the backward the cotangent's rows, dx's
# rows and the token rows once more. On a 2-core CPU those gathers took two fifths of the
# layer's stage time (`benchmarks/cvmm_profile.py`), nearly the matmuls' share. Here each block
# of rows does all its work in one iteration, while its rows are in cache: it gathers its own
# token rows by index, runs the up projection, the hidden units and the down projection, and
# adds its rows into the token outputs; the backward's loop does the same with the four gradient
# matmuls. Only the pre-activations h [R, G] are kept between the passes. Rounding follows
# `_fused` step by step, and padding rows (slot id S) read zeros and are dropped when added
# back, so a NaN in one expert's weights reaches only its slots.


def _block_rows(layout: slot_layout.SlotLayout, b):
  """Slot ids of block b's rows (S for padding) and the block's expert."""
  block = layout.row_slot_r.shape[0] // layout.groups.expert_b.shape[0]
  return (lax.dynamic_slice_in_dim(layout.row_slot_r, b * block, block),
          layout.groups.expert_b[b])


def _rows(values_s, slots_c, index_of_slot=lambda s: s):
  """values[index_of_slot(slot)] for each row, zeros for padding rows (out of range)."""
  return jnp.take(values_s, index_of_slot(slots_c), axis=0, mode="fill", fill_value=0)


def _dot(a, b, contract):
  """A block's matmul, contracting `contract` = ((a's dims), (b's dims)), f32 accumulation."""
  return lax.dot_general(a, b, (contract, ((), ())), precision=blocked.full_precision(a.dtype),
                         preferred_element_type=jnp.float32)


def _blocked_forward(activation, rate, layout, k, x_nd, g_s, keep_sg, w_up_edg, w_down_egd):
  """y [N, d] (f32) and the pre-activations h [R, G]."""
  token = lambda s: s // k

  def one_block(b, carry):
    y_nd, h_rg = carry
    slots_c, e = _block_rows(layout, b)
    x_cd = _rows(x_nd, slots_c, token)
    h_cg = _dot(x_cd, w_up_edg[e], ((1,), (0,))).astype(x_nd.dtype)
    keep_cg = None if keep_sg is None else _rows(keep_sg, slots_c)
    _, ga_cg = _hidden(activation, rate, h_cg, keep_cg, _rows(g_s, slots_c))
    z_cd = _dot(ga_cg, w_down_egd[e], ((1,), (0,)))
    y_nd = y_nd.at[token(slots_c)].add(z_cd, mode="drop")
    return y_nd, lax.dynamic_update_slice_in_dim(h_rg, h_cg, b * slots_c.shape[0], 0)

  operands = (x_nd, g_s, w_up_edg, w_down_egd)
  init = (blocked.zeros_varying_like((x_nd.shape[0], w_down_egd.shape[2]), jnp.float32,
                                     *operands),
          blocked.zeros_varying_like((layout.row_slot_r.shape[0], w_up_edg.shape[2]),
                                     x_nd.dtype, *operands))
  return lax.fori_loop(0, layout.groups.used, one_block, init)


def _blocked_backward(activation, rate, layout, k, x_nd, g_s, keep_sg, w_up_edg, w_down_egd,
                      h_rg, dy_nd):
  """dx [N, d], dgates [S], dw_up [E, d, G], dw_down [E, G, d], all f32."""
  token = lambda s: s // k
  dy_nd = dy_nd.astype(x_nd.dtype)

  def one_block(b, carry):
    dx_nd, dg_s, dw_up, dw_down = carry
    slots_c, e = _block_rows(layout, b)
    h_cg = lax.dynamic_slice_in_dim(h_rg, b * slots_c.shape[0], slots_c.shape[0])
    g_c = _rows(g_s, slots_c)
    keep_cg = None if keep_sg is None else _rows(keep_sg, slots_c)
    a_cg, ga_cg = _hidden(activation, rate, h_cg, keep_cg, g_c)
    dy_cd = _rows(dy_nd, slots_c, token)
    da_cg = _dot(dy_cd, w_down_egd[e], ((1,), (1,)))
    # Padding rows all carry slot id S, which is out of range: they are dropped.
    dg_s = dg_s.at[slots_c].set(jnp.sum(da_cg * a_cg.astype(jnp.float32), axis=-1),
                                mode="drop")
    dw_down = dw_down.at[e].add(_dot(ga_cg, dy_cd, ((0,), (0,))))
    _, activation_vjp = jax.vjp(activation, h_cg.astype(jnp.float32))
    dh_cg, = activation_vjp(_dropout(da_cg * g_c[:, None], keep_cg, rate))
    dh_cg = dh_cg.astype(x_nd.dtype)
    dx_nd = dx_nd.at[token(slots_c)].add(_dot(dh_cg, w_up_edg[e], ((1,), (1,))), mode="drop")
    dw_up = dw_up.at[e].add(_dot(_rows(x_nd, slots_c, token), dh_cg, ((0,), (0,))))
    return dx_nd, dg_s, dw_up, dw_down

  operands = (x_nd, dy_nd, g_s, w_up_edg, w_down_egd, h_rg)
  init = (blocked.zeros_varying_like(x_nd.shape, jnp.float32, *operands),
          blocked.zeros_varying_like(g_s.shape, jnp.float32, *operands),
          blocked.zeros_varying_like(w_up_edg.shape, jnp.float32, *operands),
          blocked.zeros_varying_like(w_down_egd.shape, jnp.float32, *operands))
  return lax.fori_loop(0, layout.groups.used, one_block, init)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1))
def _blocked(activation, rate, x_nd, sel_nk, gates_nk, w_up_edg, w_down_egd, keep_nkg):
  """`expert_mlp` on impl "blocked" (ids already clipped): the two loops above."""
  y, _ = _blocked_fwd(activation, rate, x_nd, sel_nk, gates_nk, w_up_edg, w_down_egd,
                      keep_nkg)
  return y


def _slot_inputs(gates_nk, keep_nkg):
  keep_sg = None if keep_nkg is None else keep_nkg.reshape(-1, keep_nkg.shape[-1])
  return gates_nk.reshape(-1).astype(jnp.float32), keep_sg


def _blocked_fwd(activation, rate, x_nd, sel_nk, gates_nk, w_up_edg, w_down_egd, keep_nkg):
  k = sel_nk.shape[1]
  layout = blocked.make_layout(sel_nk.reshape(-1), w_up_edg.shape[0])
  g_s, keep_sg = _slot_inputs(gates_nk, keep_nkg)
  y_nd, h_rg = _blocked_forward(activation, rate, layout, k, x_nd, g_s, keep_sg, w_up_edg,
                                w_down_egd)
  residuals = (x_nd, gates_nk, w_up_edg, w_down_egd, keep_nkg, layout, h_rg)
  return y_nd.astype(x_nd.dtype), residuals


def _blocked_bwd(activation, rate, residuals, dy_nd):
  x_nd, gates_nk, w_up_edg, w_down_egd, keep_nkg, layout, h_rg = residuals
  g_s, keep_sg = _slot_inputs(gates_nk, keep_nkg)
  dx_nd, dg_s, dw_up, dw_down = _blocked_backward(activation, rate, layout, gates_nk.shape[1],
                                                  x_nd, g_s, keep_sg, w_up_edg, w_down_egd,
                                                  h_rg, dy_nd)
  return (dx_nd.astype(x_nd.dtype), None, dg_s.reshape(gates_nk.shape).astype(gates_nk.dtype),
          dw_up.astype(w_up_edg.dtype), dw_down.astype(w_down_egd.dtype), None)


_blocked.defvjp(_blocked_fwd, _blocked_bwd)


def _check_inputs(x_nd, sel_nk, gates_nk, w_up_edg, w_down_egd) -> None:
  """Raise a ValueError naming the offending argument if the call breaks the contract."""
  if w_up_edg.ndim != 3 or w_down_egd.ndim != 3:
    raise ValueError(f"w_up and w_down must be [E, d, G] and [E, G, d], got {w_up_edg.shape} "
                     f"and {w_down_egd.shape}")
  num_experts, d_model, group = w_up_edg.shape
  if w_down_egd.shape != (num_experts, group, d_model):
    raise ValueError(f"w_down must have shape [E, G, d] = {(num_experts, group, d_model)} "
                     f"(from w_up {w_up_edg.shape}), got {w_down_egd.shape}")
  if sel_nk.ndim != 2 or not jnp.issubdtype(sel_nk.dtype, jnp.integer):
    raise ValueError(f"sel must be an integer array [N, k], got {sel_nk.dtype} {sel_nk.shape}")
  if x_nd.shape != (sel_nk.shape[0], d_model):
    raise ValueError(f"x must have shape [N, d] = {(sel_nk.shape[0], d_model)}, got "
                     f"{x_nd.shape}")
  if gates_nk.shape != sel_nk.shape or not jnp.issubdtype(gates_nk.dtype, jnp.floating):
    raise ValueError(f"gates must be a floating array of the shape of sel {sel_nk.shape}, "
                     f"got {gates_nk.dtype} {gates_nk.shape}")
  if not jnp.issubdtype(x_nd.dtype, jnp.floating) or {w_up_edg.dtype, w_down_egd.dtype} != {
      x_nd.dtype}:
    raise ValueError(f"x, w_up and w_down must share one floating dtype, got {x_nd.dtype}, "
                     f"{w_up_edg.dtype} and {w_down_egd.dtype}")


def expert_mlp(x_nd: jax.Array, sel_nk: jax.Array, gates_nk: jax.Array, w_up_edg: jax.Array,
               w_down_egd: jax.Array, *, activation: Callable[[jax.Array], jax.Array] = jax.nn.relu,
               impl: str = "auto", dropout_rate: float = 0.0,
               dropout_key: jax.Array | None = None) -> jax.Array:
  """The gated sum of each token's k experts: two grouped matmuls on one layout.

  Args:
    x_nd: [N, d] token rows.
    sel_nk: [N, k] integer expert ids in [0, E) (ids outside are clipped).
    gates_nk: [N, k] weights of the k slots.
    w_up_edg, w_down_egd: [E, d, G] and [E, G, d] expert weights, in the dtype of x.
    activation: an elementwise function of the hidden units (ReLU in every MoE of the paper).
    impl: as for `cvmm` ("auto", "pallas", "mosaic", "megablox", "blocked", "ragged",
      "tokamax", "gather").
    dropout_rate, dropout_key: inverted dropout of the hidden units (the paper's expert
      dropout on G units); no key means none.

  Returns:
    y_nd [N, d] in the dtype of x (f32 accumulation); differentiable in x, gates and both
    weights.

  Example:
    Three tokens, two of four experts each, against each token's experts written out:

    >>> from pallas_kernels import expert_mlp
    >>> keys = jax.random.split(jax.random.key(0), 3)
    >>> x = jax.random.normal(keys[0], (3, 8))
    >>> w_up = jax.random.normal(keys[1], (4, 8, 16))
    >>> w_down = jax.random.normal(keys[2], (4, 16, 8))
    >>> sel = jnp.array([[0, 1], [2, 3], [3, 0]])
    >>> gates = jnp.array([[0.6, 0.4], [1.0, 0.0], [0.3, 0.7]])
    >>> y = expert_mlp(x, sel, gates, w_up, w_down)
    >>> expert = lambda n, e: jax.nn.relu(x[n] @ w_up[e]) @ w_down[e]
    >>> bool(jnp.allclose(y[2], 0.3 * expert(2, 3) + 0.7 * expert(2, 0), rtol=1e-4, atol=1e-3))
    True
  """
  backends.check_impl(impl)
  _check_inputs(x_nd, sel_nk, gates_nk, w_up_edg, w_down_egd)
  impl = backends.resolve(impl, x_nd.dtype, w_up_edg.shape, w_down_egd.shape)
  sel_nk = jnp.clip(sel_nk, 0, w_up_edg.shape[0] - 1).astype(jnp.int32)
  keep_nkg = dropout_keep_mask(dropout_key, dropout_rate, (*sel_nk.shape, w_up_edg.shape[2]))
  if impl == "gather" or sel_nk.size == 0:
    return gather_oracle.expert_mlp_gather(x_nd, sel_nk, gates_nk, w_up_edg, w_down_egd,
                                           activation=activation, keep_nkg=keep_nkg,
                                           dropout_rate=dropout_rate)
  if impl == "blocked":
    return _blocked(activation, dropout_rate, x_nd, sel_nk, gates_nk, w_up_edg, w_down_egd,
                    keep_nkg)
  return _fused(backends.backend(impl), activation, dropout_rate, x_nd, sel_nk, gates_nk,
                w_up_edg, w_down_egd, keep_nkg)
