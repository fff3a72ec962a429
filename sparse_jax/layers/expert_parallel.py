"""The MoE expert computation, on one device or split over the mesh's `expert` axis.

    y[n] = sum_j gates[n, j] * dropout(relu(x[n] @ w_up[sel[n, j]])) @ w_down[sel[n, j]]

Routers run before this on global arrays (XLA partitions them, so their batch statistics
cover the whole batch); only this part needs explicit communication. With expert
parallelism each device holds `E_l = E / n_ep` experts and `N_l` tokens. It sends every token
slot to the device of its expert with an `all_to_all`, multiplies the rows it received by its
local experts (`pallas_kernels.expert_mlp`), and sends the results back. Send buffers hold
`C = N_l * k` rows per destination, the worst case, so no slot is ever dropped and the result
equals the single-device computation up to float reduction order.
"""

import functools

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

import pallas_kernels
from sparse_jax import parallel


def _local_experts(x_nd, sel_nk, gates_nk, w_up_edg, w_down_egd, *, impl, rate, key):
  """Every expert on this device: the fused expert MLP (one layout for both matmuls)."""
  return pallas_kernels.expert_mlp(x_nd, sel_nk, gates_nk, w_up_edg, w_down_egd, impl=impl,
                                   dropout_rate=rate, dropout_key=key)


def check_expert_mesh(mesh, n_experts: int, n_tokens: int) -> None:
  """Raises ValueError unless the experts and tokens split evenly over `mesh`."""
  n_ep, shards = parallel.axis_size(mesh, parallel.EXPERT), parallel.batch_shards(mesh)
  sizes = {axis: parallel.axis_size(mesh, axis) for axis in parallel.MESH_AXES}
  if n_experts % n_ep:
    raise ValueError(f"model.ff.n_experts={n_experts} must be divisible by the mesh's expert "
                     f"axis (mesh.expert={n_ep}; mesh sizes {sizes}).")
  if n_tokens % shards:
    raise ValueError(f"the {n_tokens} tokens reaching the MoE layer must split evenly over "
                     f"mesh.data * mesh.fsdp * mesh.expert = {shards} devices "
                     f"(mesh sizes {sizes}).")


def _send_plan(dest_s: jax.Array, n_ep: int) -> tuple[jax.Array, jax.Array]:
  """Where each of the `C` slots goes in the `[n_ep * C]` send buffer, and back.

  A stable sort by destination gives each slot its rank within its destination's group;
  slot s goes to row `dest[s] * C + rank[s]`. Returns `row_s [C]` and `slot_r [n_ep * C]`
  (the slot a buffer row holds, `C` for padding rows).
  """
  c = dest_s.shape[0]
  order_s = jnp.argsort(dest_s, stable=True)
  dest_sorted_s = dest_s[order_s]
  count_p = jnp.zeros((n_ep,), jnp.int32).at[dest_s].add(1)
  start_p = jnp.cumsum(count_p) - count_p
  row_sorted_s = dest_sorted_s * c + jnp.arange(c, dtype=jnp.int32) - start_p[dest_sorted_s]
  row_s = jnp.zeros((c,), jnp.int32).at[order_s].set(row_sorted_s)
  slot_r = jnp.full((n_ep * c,), c, jnp.int32).at[row_sorted_s].set(order_s.astype(jnp.int32))
  return row_s, slot_r


def _exchange(buf_r: jax.Array, n_ep: int) -> jax.Array:
  """`all_to_all` over `expert`: block p of the `[n_ep * C, ...]` rows goes to device p, and
  block p of the result came from device p (so the same call also sends results back)."""
  buf_pc = buf_r.reshape(n_ep, -1, *buf_r.shape[1:])
  buf_pc = jax.lax.all_to_all(buf_pc, parallel.EXPERT, split_axis=0, concat_axis=0)
  return buf_pc.reshape(buf_r.shape)


def _dispatch(x_nd, sel_nk, gates_nk, e_local: int, n_ep: int):
  """Sends every slot's token row, local expert id and gate to its expert's device.

  Returns the received `x_rd [n_ep * C, d]`, `expert_r`, `gate_r` (padding rows: x = 0, gate 0,
  local expert 0, so they add exactly nothing) and `row_s`, where each slot's result returns.
  """
  k = sel_nk.shape[1]
  sel_s = sel_nk.reshape(-1)
  row_s, slot_r = _send_plan(sel_s // e_local, n_ep)
  x_rd = jnp.take(x_nd, slot_r // k, axis=0, mode="fill", fill_value=0)
  expert_r = jnp.take(sel_s % e_local, slot_r, mode="fill", fill_value=0)
  gate_r = jnp.take(gates_nk.reshape(-1), slot_r, mode="fill", fill_value=0)
  return _exchange(x_rd, n_ep), _exchange(expert_r, n_ep), _exchange(gate_r, n_ep), row_s


def _expert_parallel_body(x_nd, sel_nk, gates_nk, w_up_edg, w_down_egd, *maybe_key, n_ep,
                          impl, rate, token_axes):
  """One device's shard: `N_l` tokens and `E_l` experts (see the module docstring)."""
  n, k = sel_nk.shape
  x_rd, expert_r, gate_r, row_s = _dispatch(x_nd, sel_nk, gates_nk, w_up_edg.shape[0], n_ep)
  key = jax.random.fold_in(maybe_key[0], jax.lax.axis_index(token_axes)) if maybe_key else None
  # The weights are the same on every device of a token axis other than `expert`; marking them
  # varying makes the transpose sum their gradient over those devices.
  other_axes = tuple(a for a in token_axes if a != parallel.EXPERT)
  w_up_edg, w_down_egd = jax.lax.pcast((w_up_edg, w_down_egd), other_axes, to="varying")
  y_rd = _local_experts(x_rd, expert_r[:, None], gate_r[:, None], w_up_edg, w_down_egd,
                        impl=impl, rate=rate, key=key)
  y_nkd = jnp.take(_exchange(y_rd, n_ep), row_s, axis=0).reshape(n, k, -1)
  return jnp.sum(y_nkd.astype(jnp.float32), axis=1).astype(x_nd.dtype)


def apply_experts(x_nd: jax.Array, sel_nk: jax.Array, gates_nk: jax.Array,
                  w_up_edg: jax.Array, w_down_egd: jax.Array, *, impl: str = "auto",
                  dropout_rate: float = 0.0, dropout_key: jax.Array | None = None) -> jax.Array:
  """`y_nd`: the gated sum of the k selected experts' outputs for each token.

  Uses the ambient mesh (`jax.set_mesh`): with an `expert` axis of size > 1 the tokens are
  split over the batch axes, the experts over `expert`, and slots travel by `all_to_all`;
  otherwise (no mesh, or `expert` of size 1) everything runs locally. `dropout_key=None`
  disables hidden dropout; under a mesh each device folds its position into the key. The
  splits are `sparse_jax.parallel`'s for the logical axes `batch` and `experts`.
  """
  mesh = jax.sharding.get_abstract_mesh()
  n_ep = parallel.axis_size(mesh, parallel.EXPERT)
  if n_ep == 1:
    return _local_experts(x_nd, sel_nk, gates_nk, w_up_edg, w_down_egd, impl=impl,
                          rate=dropout_rate, key=dropout_key)
  check_expert_mesh(mesh, w_up_edg.shape[0], x_nd.shape[0])
  token_axes = parallel.mesh_axes("batch", mesh)
  tokens = parallel.partition_spec(("batch", None), mesh=mesh)  # `[N, ...]` token rows
  # Inside the map a device holds whole experts: of `[E, M, L]` only `experts` is split.
  experts = parallel.partition_spec(("experts", None, None), mesh=mesh)
  body = functools.partial(_expert_parallel_body, n_ep=n_ep, impl=impl, rate=dropout_rate,
                           token_axes=token_axes)
  keys = () if dropout_key is None else (dropout_key,)
  mapped = jax.shard_map(body, in_specs=(tokens,) * 3 + (experts,) * 2 + (P(),) * len(keys),
                         out_specs=tokens)
  return mapped(x_nd, sel_nk, gates_nk, w_up_edg, w_down_egd, *keys)
