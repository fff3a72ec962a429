"""The MoE expert computation, on one device or split over the mesh's `expert` axis.

    y[n] = sum_j gates[n, j] * dropout(relu(x[n] @ w_up[sel[n, j]])) @ w_down[sel[n, j]]

Routers run before this on global arrays (XLA partitions them, so their batch statistics
cover the whole batch); only this part needs explicit communication. With expert
parallelism each device holds `E_l = E / n_ep` experts and `N_l` tokens, so `C = N_l * k`
token slots. It sends every slot (token row, local expert id, gate) to the device of its
expert, multiplies the rows it received by its local experts (`pallas_kernels.expert_mlp`;
empty rows carry x = 0 and gate 0, so they add exactly nothing) and sends the results back
to the same places. Two exchanges do this (`exchange=`):

- "padded": one `all_to_all` per array with a block of `C` rows per destination, enough for
  the worst case (all `C` slots to one device): send and receive buffers of `n_ep * C` rows
  each way, `n_ep` times the average need. Runs on every backend.
- "ragged": the devices first all-gather how many slots each sends to each (`n_ep^2`
  integers), then `jax.lax.ragged_all_to_all` sends only the used rows: a send buffer of `C`
  rows (the slots sorted by destination) and a receive buffer of `R` rows, and back. `R` must
  be static. By default it is the most a device can ever receive, `n_ep * C` (every device of
  its expert group sending it all of its slots), so no routing can overflow it. With
  `recv_factor` it is `ceil(recv_factor * C)` (`C` is the average a device receives): smaller,
  but a step whose routing needs more on some device cannot be computed exactly, so that
  expert group returns NaN for every token (its loss becomes NaN and training stops) instead
  of dropping slots; nothing is ever written past the buffer.
- "auto" (the default): "ragged" on TPU, else "padded". XLA:CPU has no ragged-all-to-all
  (jaxlib 0.10.2: "UNIMPLEMENTED: HLO opcode `ragged-all-to-all` is not supported by XLA:CPU
  ThunkEmitter"), so on CPU "ragged" only lowers (its numbers are tested through an
  emulation). XLA:GPU implements it, but public reports describe wrong gradients with 8
  devices per expert group and crashes beyond 32 in jax 0.11 (workaround
  `--xla_gpu_unsupported_enable_ragged_all_to_all_decomposer=true`), and it has not run on
  a multi-GPU machine here: on GPUs it is opt-in (`exchange="ragged"`) until it has.

Either way no slot is dropped and the result equals the single-device computation up to
float reduction order.

With a `tensor` axis of size > 1 every expert's `G` hidden units are split over it as well
(Megatron's MLP split inside each expert: `w_up [E, d, G/t]`, `w_down [E, G/t, d]`, the rules
of `sparse_jax.parallel`); the devices of a tensor group hold the same tokens, route them
alike, run their slice of every selected expert (ReLU and the gate act per hidden unit, so a
slice's output is a partial sum) and add the partial outputs with one `psum` over `tensor`:
one all-reduce of `[N_l, d]` in the forward pass and, by its transpose, one of the input
gradient in the backward. For the impls XLA can partition (`pallas_kernels.partitionable`:
the XLA impls, interpret-mode Pallas) the maps check varying axes, and marks (`pcast`) say
which gradients the transposes sum. The GPU and TPU kernels (Triton, Mosaic, megablox), which
declare no varying axes, run in maps that do not check them (`check_vma=False`), where the
marks do nothing and shard_map's transpose itself divides the output's cotangent by the size
of the axes it is replicated over and sums the gradients of the inputs replicated over an
axis (the weights over the batch axes, the rows and gates over `tensor`); with the `psum`,
whose unchecked transpose is another `psum`, the gradients are the same
(tests/layers/test_expert_parallel.py). The local experts run over all received rows
(padding included), so the receive buffer also bounds their FLOPs.
"""

import functools
import math
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

import pallas_kernels
from sparse_jax import parallel

EXCHANGES = ("auto", "ragged", "padded")
# Where "auto" picks the ragged exchange (see the module docstring for GPUs and CPUs).
RAGGED_PLATFORMS = ("tpu",)


def _local_experts(x_nd, sel_nk, gates_nk, w_up_edg, w_down_egd, *, impl, rate, key):
  """Every expert on this device: the fused expert MLP (one layout for both matmuls)."""
  return pallas_kernels.expert_mlp(x_nd, sel_nk, gates_nk, w_up_edg, w_down_egd, impl=impl,
                                   dropout_rate=rate, dropout_key=key)


def check_expert_mesh(mesh, n_experts: int, n_tokens: int, expert_size: int = 1) -> None:
  """Raises ValueError unless the experts, their `expert_size` hidden units and the tokens
  split evenly over `mesh`."""
  n_ep, shards = parallel.axis_size(mesh, parallel.EXPERT), parallel.batch_shards(mesh)
  n_tp = parallel.axis_size(mesh, parallel.TENSOR)
  sizes = {axis: parallel.axis_size(mesh, axis) for axis in parallel.MESH_AXES}
  if n_experts % n_ep:
    raise ValueError(f"model.ff.n_experts={n_experts} must be divisible by the mesh's expert "
                     f"axis (mesh.expert={n_ep}; mesh sizes {sizes}).")
  if expert_size % n_tp:
    raise ValueError(f"model.ff.expert_size={expert_size} must be divisible by the mesh's "
                     f"tensor axis (mesh.tensor={n_tp}; mesh sizes {sizes}).")
  if n_tokens % shards:
    raise ValueError(f"the {n_tokens} tokens reaching the MoE layer must split evenly over "
                     f"mesh.data * mesh.fsdp * mesh.expert = {shards} devices "
                     f"(mesh sizes {sizes}).")


def resolve_exchange(exchange: str, mesh) -> str:
  """"ragged" or "padded": `exchange`, with "auto" decided by the platform of `mesh`'s
  devices (the default backend when the mesh does not say)."""
  if exchange not in EXCHANGES:
    raise ValueError(f"exchange must be one of {EXCHANGES}, got {exchange!r}")
  if exchange != "auto":
    return exchange
  device = None if mesh.empty else mesh.abstract_device
  platform = getattr(device, "platform", None) or jax.default_backend()
  return "ragged" if platform in RAGGED_PLATFORMS else "padded"


def check_recv_factor(recv_factor: float | None) -> None:
  """Raises ValueError unless `recv_factor` is None or positive."""
  if recv_factor is not None and not recv_factor > 0:
    raise ValueError(f"recv_factor must be positive (or None: the worst case), "
                     f"got {recv_factor}")


def recv_rows(n_ep: int, slots: int, recv_factor: float | None) -> int:
  """`R`, the rows of a device's ragged receive buffer for `slots = C` slots per device:
  `n_ep * C` (the most any routing sends one device) or `ceil(recv_factor * C)`, capped."""
  check_recv_factor(recv_factor)
  if recv_factor is None:
    return n_ep * slots
  return min(n_ep * slots, math.ceil(recv_factor * slots))


class _Route(NamedTuple):
  """How one device's `C` slots reach their experts and come back.

  slot_b: [B] the slot each row of the send buffer holds (`C` marks a padding row).
  there: send buffer `[B, ...]` -> the rows this device received `[R, ...]` (empty rows 0).
  back: results `[R, ...]` -> `[B, ...]`, each row where its slot was sent from.
  fits: False (a traced boolean) when the receive buffer could not hold this step's slots.
  """
  slot_b: jax.Array
  there: Callable[[jax.Array], jax.Array]
  back: Callable[[jax.Array], jax.Array]
  fits: jax.Array | bool


def _all_to_all(buf_b: jax.Array, n_ep: int) -> jax.Array:
  """`all_to_all` over `expert`: block p of the `[n_ep * C, ...]` rows goes to device p, and
  block p of the result came from device p (so the same call also sends results back)."""
  buf_pc = buf_b.reshape(n_ep, -1, *buf_b.shape[1:])
  buf_pc = jax.lax.all_to_all(buf_pc, parallel.EXPERT, split_axis=0, concat_axis=0)
  return buf_pc.reshape(buf_b.shape)


def _padded_route(dest_s: jax.Array, n_ep: int) -> _Route:
  """Blocks of `C` rows per destination: slot s goes to row `dest[s] * C + rank[s]`, its rank
  within its destination's slots (a stable sort by destination gives it)."""
  c = dest_s.shape[0]
  order_s = jnp.argsort(dest_s, stable=True)
  dest_sorted_s = dest_s[order_s]
  count_p = jnp.zeros((n_ep,), jnp.int32).at[dest_s].add(1)
  start_p = jnp.cumsum(count_p) - count_p
  row_sorted_s = dest_sorted_s * c + jnp.arange(c, dtype=jnp.int32) - start_p[dest_sorted_s]
  slot_b = jnp.full((n_ep * c,), c, jnp.int32).at[row_sorted_s].set(order_s.astype(jnp.int32))
  exchange = functools.partial(_all_to_all, n_ep=n_ep)
  return _Route(slot_b, exchange, exchange, fits=True)


def _ragged_all_to_all(buf_b, rows: int, send_start_p, send_count_p, dest_start_p,
                       recv_count_p) -> jax.Array:
  """`ragged_all_to_all` over `expert` into a zero buffer of `rows` rows: rows
  `[send_start[p], + send_count[p])` go to device p at `dest_start[p]`; `recv_count[p]` rows
  arrive from p. The buffer is built from `buf_b` so that it varies over the same mesh axes
  (the result takes the buffer's type)."""
  out_r = jnp.zeros_like(buf_b, shape=(rows, *buf_b.shape[1:]))
  return jax.lax.ragged_all_to_all(buf_b, out_r, send_start_p, send_count_p, dest_start_p,
                                   recv_count_p, axis_name=parallel.EXPERT)


def _ragged_route(dest_s: jax.Array, n_ep: int, rows: int) -> _Route:
  """The slots sorted by destination, sent as one ragged piece per destination.

  `count_qp[q, p]` is how many slots device q sends to device p (all-gathered, so every
  device of the expert group knows the whole matrix and they all agree on `fits`). In q's
  send buffer its slots for p start at `send_start_qp[q, p]`; on p they land after those of
  the devices before q, at `recv_start_qp[q, p]`. The way back swaps the two. If some device
  would receive more than `rows`, every count is zeroed (nothing moves, `fits` is False).
  """
  c = dest_s.shape[0]
  slot_b = jnp.argsort(dest_s, stable=True).astype(jnp.int32)
  count_p = jnp.zeros((n_ep,), jnp.int32).at[dest_s].add(1)
  count_qp = jax.lax.all_gather(count_p, parallel.EXPERT)
  fits = jnp.all(jnp.sum(count_qp, axis=0) <= rows)
  count_qp = jnp.where(fits, count_qp, 0)
  send_start_qp = jnp.cumsum(count_qp, axis=1) - count_qp
  recv_start_qp = jnp.cumsum(count_qp, axis=0) - count_qp
  me = jax.lax.axis_index(parallel.EXPERT)
  sent_p, received_p = count_qp[me], count_qp[:, me]

  def there(buf_b):
    return _ragged_all_to_all(buf_b, rows, send_start_qp[me], sent_p, recv_start_qp[me],
                              received_p)

  def back(buf_r):
    return _ragged_all_to_all(buf_r, c, recv_start_qp[:, me], received_p,
                              send_start_qp[:, me], sent_p)

  return _Route(slot_b, there, back, fits)


def _row_of_slot(slot_b: jax.Array, c: int) -> jax.Array:
  """`[C]`: the send-buffer row holding each slot (padding rows, `slot == C`, dropped)."""
  rows_b = jnp.arange(slot_b.shape[0], dtype=jnp.int32)
  return jnp.zeros((c,), jnp.int32).at[slot_b].set(rows_b, mode="drop")


def _expert_parallel_body(x_nd, sel_nk, gates_nk, w_up_edg, w_down_egd, *maybe_key, n_ep,
                          check_vma, exchange, recv_factor, impl, rate, token_axes, tensor,
                          seq_len):
  """One device's shard: `N_l` tokens and `E_l` experts, with `tensor` a `G / t` slice of
  each (see the module docstring); with `seq_len` (sequence parallelism) the slices' sums
  are reduce-scattered along T (`_scatter_over_tensor`)."""
  n, k = sel_nk.shape
  e_local = w_up_edg.shape[0]
  sel_s = sel_nk.reshape(-1)
  if exchange == "ragged":
    route = _ragged_route(sel_s // e_local, n_ep, recv_rows(n_ep, n * k, recv_factor))
  else:
    route = _padded_route(sel_s // e_local, n_ep)
  x_rd = route.there(jnp.take(x_nd, route.slot_b // k, axis=0, mode="fill", fill_value=0))
  expert_r = route.there(jnp.take(sel_s % e_local, route.slot_b, mode="fill", fill_value=0))
  gate_r = route.there(jnp.take(gates_nk.reshape(-1), route.slot_b, mode="fill",
                                fill_value=0))
  mask_axes = token_axes + (parallel.TENSOR,) if tensor else token_axes
  key = jax.random.fold_in(maybe_key[0], jax.lax.axis_index(mask_axes)) if maybe_key else None
  # The weights are the same on every device of a token axis other than `expert`; marking them
  # varying makes the transpose sum their gradient over those devices. (Unchecked, the marks
  # do nothing and shard_map's transpose sums them itself: the module docstring.)
  other_axes = tuple(a for a in token_axes if a != parallel.EXPERT)
  w_up_edg, w_down_egd = jax.lax.pcast((w_up_edg, w_down_egd), other_axes, to="varying")
  if tensor:
    x_rd, gate_r = _to_tensor_slices(x_rd, gate_r)
  y_rd = _local_experts(x_rd, expert_r[:, None], gate_r[:, None], w_up_edg, w_down_egd,
                        impl=impl, rate=rate, key=key)
  y_bd = route.back(y_rd)
  y_nkd = jnp.take(y_bd, _row_of_slot(route.slot_b, n * k), axis=0).reshape(n, k, -1)
  y_nd = jnp.sum(y_nkd.astype(jnp.float32), axis=1).astype(x_nd.dtype)
  if tensor:
    y_nd = _sum_over_tensor(y_nd) if seq_len is None else _scatter_over_tensor(y_nd, seq_len)
  return jnp.where(route.fits, y_nd, jnp.nan)


def _data_parallel(x_nd, sel_nk, gates_nk, w_up_edg, w_down_egd, mesh, *, impl, rate, key):
  """Every expert on every device, each device on its own tokens: a GPU or TPU kernel
  (`pallas_kernels.partitionable`) on a mesh that splits the batch but not the experts.
  Each device folds its position into the dropout key, as with expert parallelism.

  The map does not check varying axes (`check_vma=False`): JAX's own TPU kernels (megablox)
  declare outputs without them. Unchecked, shard_map's transpose sums the replicated
  weights' gradients over the devices itself."""
  check_expert_mesh(mesh, w_up_edg.shape[0], x_nd.shape[0])
  token_axes = parallel.mesh_axes("batch", mesh)
  tokens = parallel.partition_spec(("batch", None), mesh=mesh)

  def body(x_nd, sel_nk, gates_nk, w_up_edg, w_down_egd, *maybe_key):
    key = (jax.random.fold_in(maybe_key[0], jax.lax.axis_index(token_axes)) if maybe_key
           else None)
    return _local_experts(x_nd, sel_nk, gates_nk, w_up_edg, w_down_egd, impl=impl, rate=rate,
                          key=key)

  keys = () if key is None else (key,)
  mapped = jax.shard_map(body, in_specs=(tokens,) * 3 + (P(),) * (2 + len(keys)),
                         out_specs=tokens, check_vma=False)
  return mapped(x_nd, sel_nk, gates_nk, w_up_edg, w_down_egd, *keys)


def _expert_specs(mesh) -> tuple[P, P]:
  """What a device holds of `w_up [E, d, G]` and `w_down [E, G, d]` inside the maps: whole
  experts split over `expert` and their hidden units over `tensor` (`parallel`'s rules on
  those two axes; fsdp and the rest are gathered at the map's edge). A tensor axis of size 1
  is left out: weights split over it would vary over it, and so would the map's output."""
  tensor = (parallel.TENSOR,) if parallel.axis_size(mesh, parallel.TENSOR) > 1 else ()
  only = (parallel.EXPERT,) + tensor
  return (parallel.partition_spec(("experts", None, "mlp"), mesh=mesh, only=only),
          parallel.partition_spec(("experts", "mlp", None), mesh=mesh, only=only))


def _to_tensor_slices(x_nd: jax.Array, gates_nk: jax.Array) -> tuple[jax.Array, jax.Array]:
  """The rows and gates (the same on every device of a tensor group) marked varying over
  `tensor` before the kernel: its gradients then come out per `G` slice, and the transpose
  of the mark sums them over `tensor` (Megatron's "f"; its "g" is `_sum_over_tensor`)."""
  return jax.lax.pcast((x_nd, gates_nk), parallel.TENSOR, to="varying")


def _sum_over_tensor(y_nd: jax.Array) -> jax.Array:
  """The partial outputs of the `G` slices added over `tensor` (in float32)."""
  return jax.lax.psum(y_nd.astype(jnp.float32), parallel.TENSOR).astype(y_nd.dtype)


def _scatter_over_tensor(y_nd: jax.Array, seq_len: int) -> jax.Array:
  """Sequence parallelism: a device's partial outputs (of its `G` slices, or its heads'),
  whole sequences as `[B_l * T, d]` rows or `[B_l, T, d]`, added over `tensor` and split
  along T, `[B_l, T / t, d]` (a reduce-scatter in float32; its transpose all-gathers the
  output gradient)."""
  y_btd = y_nd.reshape(-1, seq_len, y_nd.shape[-1]).astype(jnp.float32)
  return jax.lax.psum_scatter(y_btd, parallel.TENSOR, scatter_dimension=1,
                              tiled=True).astype(y_nd.dtype)


def _tensor_parallel(x_nd, sel_nk, gates_nk, w_up_edg, w_down_egd, mesh, *, impl, rate, key,
                     check_vma, seq_len):
  """Every expert on every device of a tensor group, each device on its `G / t` slice of
  them and on its tokens (module docstring; `check_vma` False for a kernel XLA cannot
  partition). Each device folds its position over the batch axes and `tensor` into the
  dropout key: its mask covers its own rows and units. With `seq_len` (sequence
  parallelism) the output is `[B, T, d]` on sequence shards (`_scatter_over_tensor`)."""
  check_expert_mesh(mesh, w_up_edg.shape[0], x_nd.shape[0], w_up_edg.shape[2])
  token_axes = parallel.mesh_axes("batch", mesh)
  # The same weights on every device of a batch axis but `expert` (which splits them, size 1
  # here): marked varying, their gradients are summed over those devices by the transpose
  # (over axes of size 1 too, moving nothing: the rows vary over every batch axis).
  other_axes = tuple(a for a in token_axes if a != parallel.EXPERT)
  mask_axes = token_axes + (parallel.TENSOR,)
  tokens = parallel.partition_spec(("batch", None), mesh=mesh)
  up, down = _expert_specs(mesh)

  def body(x_nd, sel_nk, gates_nk, w_up_edg, w_down_egd, *maybe_key):
    key = (jax.random.fold_in(maybe_key[0], jax.lax.axis_index(mask_axes)) if maybe_key
           else None)
    w_up_edg, w_down_egd = jax.lax.pcast((w_up_edg, w_down_egd), other_axes, to="varying")
    x_nd, gates_nk = _to_tensor_slices(x_nd, gates_nk)
    y_nd = _local_experts(x_nd, sel_nk, gates_nk, w_up_edg, w_down_egd, impl=impl, rate=rate,
                          key=key)
    return _sum_over_tensor(y_nd) if seq_len is None else _scatter_over_tensor(y_nd, seq_len)

  keys = () if key is None else (key,)
  out = tokens if seq_len is None else parallel.partition_spec(
      parallel.sequence_shard_axes(), mesh=mesh)
  mapped = jax.shard_map(body, in_specs=(tokens,) * 3 + (up, down) + (P(),) * len(keys),
                         out_specs=out, check_vma=check_vma)
  return mapped(x_nd, sel_nk, gates_nk, w_up_edg, w_down_egd, *keys)


def token_parallel_cvmm(x: jax.Array, sel_nk: jax.Array, w_eml: jax.Array,
                        gates_nk: jax.Array, *, impl: str = "auto") -> jax.Array:
  """`pallas_kernels.cvmm` (gated, `[N, L]`) on token rows split over the ambient mesh's batch
  axes, for experts that are never expert-parallel (SwitchHead's): as it is where XLA can
  partition the resolved impl; a GPU or TPU kernel it cannot partition
  (`pallas_kernels.partitionable`) runs on each device's rows inside `shard_map`, the weights
  replicated, as `_data_parallel` runs the expert MLP (unchecked varying axes, so the
  weights' gradients are summed over the devices by the transpose)."""
  mesh = jax.sharding.get_abstract_mesh()
  resolved = pallas_kernels.resolve(impl, x.dtype, w_eml.shape)
  if parallel.batch_shards(mesh) == 1 or pallas_kernels.partitionable(resolved):
    return pallas_kernels.cvmm(x, sel_nk, w_eml, gates_nk, impl=impl)
  rows = parallel.partition_spec(("batch",) + (None,) * (x.ndim - 1), mesh=mesh)
  slots = parallel.partition_spec(("batch", None), mesh=mesh)
  mapped = jax.shard_map(functools.partial(pallas_kernels.cvmm, impl=impl),
                         in_specs=(rows, slots, P(), slots), out_specs=slots, check_vma=False)
  return mapped(x, sel_nk, w_eml, gates_nk)


def head_parallel(per_heads: Callable, x: jax.Array, x_axes: tuple[str | None, ...],
                  gates_bthk: jax.Array, sel_bthk: jax.Array, w_rml: jax.Array, *, impl: str,
                  sum_heads: bool, scatter: bool = False) -> jax.Array:
  """`per_heads(x, gates, sel, w, cvmm=...)`, SwitchHead's expert projection for the heads of
  `gates`/`sel` `[B, T, H, K]` and their experts, rows `h * E + e` of `w_rml`, with the heads
  split over the ambient mesh's `tensor` axis (`x_axes`: the logical axes of `x`).

  XLA's partitioner gathered every device's experts to run the grouped matmul (weights
  moved each step); here each device runs its `H / t` heads' experts on its tokens inside
  `shard_map` (Megatron's split by head): the value projection's output stays split by head
  for the attention (`sum_heads=False`), the output projection's partial sums over the
  device's heads are added with one `psum` over `tensor` (`sum_heads=True`), whose transpose,
  with the marks below, all-reduces the input gradient of the values' input. A GPU or TPU
  kernel (`pallas_kernels.partitionable` False) runs in a map that does not check varying
  axes (the module docstring: the marks then do nothing, shard_map's transpose sums). With
  `scatter` (sequence parallelism) the output projection's partial sums `[B, T, d]` are
  reduce-scattered along T instead, onto sequence shards.
  """
  mesh = jax.sharding.get_abstract_mesh()
  check_vma = pallas_kernels.partitionable(pallas_kernels.resolve(impl, x.dtype, w_rml.shape))
  batch_axes = parallel.mesh_axes("batch", mesh)
  only = batch_axes + (parallel.TENSOR,)
  spec = lambda axes: parallel.partition_spec(axes, mesh=mesh, only=only)
  slots = spec(("batch", None, "heads", None))
  x_split_by_head = "heads" in x_axes

  def body(x, gates_bthk, sel_bthk, w_rml):
    # Same weights on every device of the batch axes, same `x` on every device of `tensor`
    # (when it is not split by head): marked varying, the transpose sums their gradients.
    w_rml = jax.lax.pcast(w_rml, batch_axes, to="varying")
    if not x_split_by_head:
      x = jax.lax.pcast(x, parallel.TENSOR, to="varying")
    y = per_heads(x, gates_bthk, sel_bthk, w_rml,
                  cvmm=functools.partial(pallas_kernels.cvmm, impl=impl))
    if not sum_heads:
      return y
    return _scatter_over_tensor(y, y.shape[1]) if scatter else _sum_over_tensor(y)

  out = (slots if not sum_heads else
         spec(parallel.sequence_shard_axes()) if scatter
         else spec(parallel.whole_sequence_axes()))
  # A device holds its heads' experts whole (fsdp, if any, gathered at the map's edge).
  experts = parallel.partition_spec(("heads", None, None), mesh=mesh, only=(parallel.TENSOR,))
  mapped = jax.shard_map(body, in_specs=(spec(x_axes), slots, slots, experts), out_specs=out,
                         check_vma=check_vma)
  return mapped(x, gates_bthk, sel_bthk, w_rml)


def apply_experts(x_nd: jax.Array, sel_nk: jax.Array, gates_nk: jax.Array,
                  w_up_edg: jax.Array, w_down_egd: jax.Array, *, impl: str = "auto",
                  dropout_rate: float = 0.0, dropout_key: jax.Array | None = None,
                  exchange: str = "auto", recv_factor: float | None = None,
                  seq_len: int | None = None) -> jax.Array:
  """`y_nd`: the gated sum of the k selected experts' outputs for each token.

  Uses the ambient mesh (`jax.set_mesh`): with an `expert` axis of size > 1 the tokens are
  split over the batch axes, the experts over `expert`, and slots travel by the `exchange`
  of the module docstring ("auto": ragged on TPU, padded elsewhere); otherwise (no
  mesh, or `expert` of size 1) everything runs locally. `recv_factor` bounds the ragged
  exchange's receive buffer to `recv_factor * N_l * k` rows (None: the worst case, which no
  routing exceeds; see the module docstring for what happens beyond it); the padded
  exchange always holds the worst case. `dropout_key=None` disables hidden dropout; under a
  mesh each device folds its position into the key. The splits are `sparse_jax.parallel`'s
  for the logical axes `batch` and `experts`. `seq_len` (sequence parallelism, on a mesh
  with `tensor`; the rows are whole sequences of that length): the output comes back as
  `[N / seq_len, seq_len, d]` on sequence shards, reduce-scattered.
  """
  mesh = jax.sharding.get_abstract_mesh()
  n_ep, n_tp = parallel.axis_size(mesh, parallel.EXPERT), parallel.axis_size(mesh, parallel.TENSOR)
  exchange = resolve_exchange(exchange, mesh)
  check_recv_factor(recv_factor)
  resolved = pallas_kernels.resolve(impl, x_nd.dtype, w_up_edg.shape, w_down_egd.shape)
  check_vma = pallas_kernels.partitionable(resolved)
  if seq_len is not None and n_tp == 1:
    raise ValueError("seq_len (sequence parallelism) needs a mesh with tensor > 1.")
  if n_ep == 1:
    if n_tp > 1:
      return _tensor_parallel(x_nd, sel_nk, gates_nk, w_up_edg, w_down_egd, mesh, impl=impl,
                              rate=dropout_rate, key=dropout_key, check_vma=check_vma,
                              seq_len=seq_len)
    if parallel.batch_shards(mesh) > 1 and not check_vma:
      return _data_parallel(x_nd, sel_nk, gates_nk, w_up_edg, w_down_egd, mesh, impl=impl,
                            rate=dropout_rate, key=dropout_key)
    return _local_experts(x_nd, sel_nk, gates_nk, w_up_edg, w_down_egd, impl=impl,
                          rate=dropout_rate, key=dropout_key)
  check_expert_mesh(mesh, w_up_edg.shape[0], x_nd.shape[0], w_up_edg.shape[2])
  token_axes = parallel.mesh_axes("batch", mesh)
  tokens = parallel.partition_spec(("batch", None), mesh=mesh)  # `[N, ...]` token rows
  # Inside the map a device holds whole experts (`experts` split), their units over `tensor`.
  up, down = _expert_specs(mesh)
  body = functools.partial(_expert_parallel_body, n_ep=n_ep, check_vma=check_vma,
                           exchange=exchange,
                           recv_factor=recv_factor, impl=impl, rate=dropout_rate,
                           token_axes=token_axes, tensor=n_tp > 1, seq_len=seq_len)
  keys = () if dropout_key is None else (dropout_key,)
  out = tokens if seq_len is None else parallel.partition_spec(
      parallel.sequence_shard_axes(), mesh=mesh)
  mapped = jax.shard_map(body, in_specs=(tokens,) * 3 + (up, down) + (P(),) * len(keys),
                         out_specs=out, check_vma=check_vma)
  return mapped(x_nd, sel_nk, gates_nk, w_up_edg, w_down_egd, *keys)
