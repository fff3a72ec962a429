"""Product-key memory (Lample et al. 2019) as in the sigma-MoE paper (Sec. 3.2, App. A.3).

The input itself is the query (no query network, no batch norm). It is split into halves
`x_a | x_b`; per head, each half scores `n_subkeys` sub-keys, the top-`knn` of each half are
combined into the `knn^2` candidate sums `u[i] = u_b[i // n] + u_a[i mod n]` (Eq. 8), and the
top-`knn` candidates, which are guaranteed to be the top-`knn` of all `n^2`, select values.

When `knn >= n_subkeys` the first top-k keeps every sub-key, and the authors' code (which all
their sweeps ran: knn 128 against 46-89 sub-keys) switches to a dense read instead: the scores
of all `n^2` values, summed over the heads, then the activation over all of them
(`dense_scores`). That is our default there too; `dense_when_knn_covers=False` keeps the
per-head top-knn of Lample's algorithm.

Tensor parallelism (`sparse_jax.parallel`): the values are the layer's hidden units (the paper
matches a PKM of `n^2` values to a dense FF of `d_ff = n^2`), so they are split by row over
`tensor` (`mlp`), as the dense FF's down projection is, and one all-reduce of `B x T x d`
adds each device's partial sums. Read as a matrix (the dense path, and `weighted_value_sum`'s
dense read of small tables), XLA's partitioner splits the read by itself: each device
activates and reads its own values' scores (a softmax's max and sum reduced over the devices,
`[B, T]` each). A gathered read (`knn` values per head from a large table) runs in
`shard_map`, each device gathering the chosen rows it holds
(`gathered_value_sum_over_tensor`). The sub-keys are split by head (`heads`) where `tensor`
divides the heads, else whole; their scores are `[B, T, H, n]`, small.

Under sequence parallelism (`layers.sequence_parallel`) the layer reads its input gathered
along T, and each device's partial sums over its value rows are reduce-scattered onto sequence
shards instead of all-reduced: in the gathered read's map, or, read as a matrix, by
`sequence_parallel.row_parallel` (the values are the FF's down projection).
"""

import jax
import jax.numpy as jnp
from flax import nnx

from sparse_jax import parallel
from sparse_jax.layers import initializers, sequence_parallel
from sparse_jax.layers.feed_forward import FeedForward, split_over_tensor
from sparse_jax.layers.precision import f32_einsum

ACTIVATIONS = ("relu", "softmax")
INITS = ("authors", "dense", "lample")
# Tables of at most this many values per selected value (`n_heads * knn`) are read densely.
DENSE_READ_MAX_RATIO = 16


def product_key_topk(scores_a_nhs: jax.Array, scores_b_nhs: jax.Array, knn: int):
  """Two-stage top-k over the `n^2` sums `scores_b[j] + scores_a[i]`.

  Each half keeps its `m = min(knn, n)` best sub-keys; the top-`knn` of all `n^2` sums are
  among those `m^2` candidates (`knn <= n^2`). Returns `(scores [N, H, knn],
  value_ids [N, H, knn])` with value id `j * n + i`.
  """
  n = scores_a_nhs.shape[-1]
  m = min(knn, n)
  top_a, ids_a = jax.lax.top_k(scores_a_nhs, m)
  top_b, ids_b = jax.lax.top_k(scores_b_nhs, m)
  cand_nhmm = top_b[..., :, None] + top_a[..., None, :]
  tokens, heads = cand_nhmm.shape[:2]
  scores, flat = jax.lax.top_k(cand_nhmm.reshape(tokens, heads, m * m), knn)
  chosen_b = jnp.take_along_axis(ids_b, flat // m, axis=-1)
  chosen_a = jnp.take_along_axis(ids_a, flat % m, axis=-1)
  return scores, chosen_b * n + chosen_a


def weighted_value_sum(weights_nhk: jax.Array, ids_nhk: jax.Array, values_vd: jax.Array, *,
                       dense: bool) -> jax.Array:
  """`y[n] = sum_{h, k} weights[n, h, k] * values[ids[n, h, k]]`: `[N, d]`.

  `dense=False` gathers the `[N, H, knn, d]` selected rows (their gradient is a scatter-add of
  as many rows). `dense=True` scatters the `N H knn` weights into a `[N, V]` matrix and
  multiplies it by the table: the same sum with `V / (H knn)` times the multiply-adds, but
  dense matmuls in both passes, which on CPU is about 6x faster for a 900-value table
  (`use_dense_read` picks it for small tables).
  """
  if not dense:
    return jnp.einsum("nhk,nhkd->nd", weights_nhk, jnp.take(values_vd, ids_nhk, axis=0))
  return value_weights(weights_nhk, ids_nhk, values_vd.shape[0]) @ values_vd


def value_weights(weights_nhk: jax.Array, ids_nhk: jax.Array, n_values: int) -> jax.Array:
  """`[N, V]`: each token's weights scattered onto the values they select (summed where
  heads select the same value)."""
  n = weights_nhk.shape[0]
  rows_nhk = jnp.broadcast_to(jnp.arange(n)[:, None, None], ids_nhk.shape)
  return jnp.zeros((n, n_values), weights_nhk.dtype).at[rows_nhk, ids_nhk].add(weights_nhk)


def gathered_value_sum_over_tensor(weights_nhk: jax.Array, ids_nhk: jax.Array,
                                   values_vd: jax.Array, seq_len: int | None = None
                                   ) -> jax.Array:
  """`weighted_value_sum(..., dense=False)` with the value rows split over the ambient
  mesh's `tensor` axis (the tokens over the batch axes), in `shard_map`: each device gathers
  the chosen rows it holds (the others' weights zeroed) and one `psum` adds the partial sums,
  an all-reduce of `[N, d]` (XLA's partitioner instead all-reduced the gathered
  `[N, H, knn, d]`). Replicated inputs meet split ones, so shard_map's transposes sum the
  weights' gradient over `tensor` and the values' over the batch axes. With `seq_len`
  (sequence parallelism; the tokens are whole sequences of that length) the sums are
  reduce-scattered along T instead: `[N / seq_len, seq_len, d]` on sequence shards."""
  mesh = jax.sharding.get_abstract_mesh()
  batch_axes = parallel.mesh_axes("batch", mesh)
  tokens = lambda ndim: parallel.partition_spec(("batch",) + (None,) * (ndim - 1), mesh=mesh,
                                                only=batch_axes)
  rows = parallel.partition_spec(("mlp", None), mesh=mesh, only=(parallel.TENSOR,))

  def body(weights_nhk, ids_nhk, values_ld):
    n_local = values_ld.shape[0]
    local_nhk = ids_nhk - jax.lax.axis_index(parallel.TENSOR) * n_local
    mine_nhk = (local_nhk >= 0) & (local_nhk < n_local)
    picked_nhkd = jnp.take(values_ld, jnp.clip(local_nhk, 0, n_local - 1), axis=0)
    y_nd = jnp.einsum("nhk,nhkd->nd", jnp.where(mine_nhk, weights_nhk, 0), picked_nhkd)
    if seq_len is None:
      return jax.lax.psum(y_nd, parallel.TENSOR)
    return jax.lax.psum_scatter(y_nd.reshape(-1, seq_len, y_nd.shape[-1]), parallel.TENSOR,
                                scatter_dimension=1, tiled=True)

  out = tokens(2) if seq_len is None else parallel.partition_spec(
      parallel.sequence_shard_axes(), mesh=mesh, only=batch_axes + (parallel.TENSOR,))
  return jax.shard_map(body, in_specs=(tokens(3), tokens(3), rows),
                       out_specs=out)(weights_nhk, ids_nhk, values_vd)


def dense_scores(scores_a_nhs: jax.Array, scores_b_nhs: jax.Array) -> jax.Array:
  """`[N, n^2]` the score of every value, summed over the heads: value `j * n + i` scores
  `sum_h scores_b[h, j] + scores_a[h, i]`."""
  sum_a_ns, sum_b_ns = scores_a_nhs.sum(axis=1), scores_b_nhs.sum(axis=1)
  return (sum_b_ns[:, :, None] + sum_a_ns[:, None, :]).reshape(sum_a_ns.shape[0], -1)


def use_dense_read(n_values: int, n_heads: int, knn: int) -> bool:
  """Dense reads for tables of at most `DENSE_READ_MAX_RATIO` values per selected value."""
  return n_values <= DENSE_READ_MAX_RATIO * n_heads * knn


class PKM(FeedForward):
  """`y = sum_{heads, knn} act(score) * values[id]`; FF contract `y, aux = pkm(x)`.

  `activation="relu"` is the paper's non-competitive choice; `"softmax"` is Lample's, taken
  jointly over heads x knn (over all values on the dense path). Inits: `"authors"` (their
  default) draws sub-keys and values from N(0, 2 / (n_layers d_model)); `"dense"` is
  "PKM + init" (Table 5): sub-keys and values initialised like the dense baseline's W1 and W2
  (d_ff = number of values); `"lample"` uses uniform sub-keys in `+-1/sqrt(d_model / 2)` and
  values `N(0, 1/d_model)`.

  `dense_when_knn_covers` (default True) takes the authors' dense path when
  `knn >= n_subkeys` (module docstring). `flops_per_token` counts the sparse read (`knn`
  values per head), as the paper does, or the whole table on the dense path; small tables
  are read densely on the sparse path too (`weighted_value_sum`), which is faster on CPU.
  """

  def __init__(self, d_model: int, n_subkeys: int, knn: int, *, n_layers: int,
               n_heads: int = 4, activation: str = "relu", init: str = "authors",
               dense_when_knn_covers: bool = True, rngs: nnx.Rngs):
    if d_model % 2 or activation not in ACTIVATIONS or init not in INITS:
      raise ValueError(f"PKM needs an even d_model, activation in {ACTIVATIONS}, init in "
                       f"{INITS}; got {d_model}, {activation!r}, {init!r}.")
    self.d_model, self.n_subkeys, self.knn, self.n_heads = d_model, n_subkeys, knn, n_heads
    self.activation = activation
    self.dense_path = dense_when_knn_covers and knn >= n_subkeys
    half, n_values = d_model // 2, n_subkeys ** 2
    key_shape = (n_heads, 2, n_subkeys, half)
    if init in ("authors", "dense"):
      key_std = initializers.depth_scaled_std(d_model, n_layers)
      keys = jax.nn.initializers.normal(key_std)(rngs.params(), key_shape)
      value_std = key_std if init == "authors" else initializers.depth_scaled_std(
          n_values, n_layers)
    else:
      bound = half ** -0.5
      keys = jax.random.uniform(rngs.params(), key_shape, minval=-bound, maxval=bound)
      value_std = d_model ** -0.5
    self.sub_keys = nnx.Param(keys, logical_axes=("heads", "key_half", "memory", "embed"))
    self.dense_read = self.dense_path or use_dense_read(n_values, n_heads, knn)
    self.values = nnx.Param(
        jax.nn.initializers.normal(value_std)(rngs.params(), (n_values, d_model)),
        logical_axes=("mlp", "embed"))

  def __call__(self, x: jax.Array) -> tuple[jax.Array, dict[str, jax.Array]]:
    dtype = x.dtype
    if sequence_parallel.active():  # On sequence shards: read whole sequences (docstring).
      x = parallel.whole_sequences(x)
    x_nd = self.token_rows(x, self.d_model)
    half = self.d_model // 2
    keys = self.sub_keys[...].astype(dtype)
    scores_a = f32_einsum("nd,hsd->nhs", x_nd[:, :half], keys[:, 0])
    scores_b = f32_einsum("nd,hsd->nhs", x_nd[:, half:], keys[:, 1])
    values = self.values[...].astype(dtype)
    if self.dense_path:
      weights_nv = self._activate(dense_scores(scores_a, scores_b))
      y = self._matrix_read(weights_nv.astype(dtype), values, x.shape)
      usage = jnp.sum(weights_nv > 0, axis=0, dtype=jnp.int32)
    else:
      scores_nhk, ids_nhk = product_key_topk(scores_a, scores_b, self.knn)
      n = scores_nhk.shape[0]
      weights_nhk = self._activate(scores_nhk.reshape(n, -1)).reshape(scores_nhk.shape)
      y = self._read(weights_nhk.astype(dtype), ids_nhk, values, x.shape)
      usage = jnp.zeros((self.n_subkeys ** 2,), jnp.int32).at[ids_nhk].add(1)
    return y.reshape(x.shape), {"reg_loss": jnp.zeros((), jnp.float32),
                                "value_usage": usage}

  def _read(self, weights_nhk: jax.Array, ids_nhk: jax.Array, values_vd: jax.Array,
            shape: tuple[int, ...]) -> jax.Array:
    """The top-knn path's `sum_{h, k} weights * values[ids]` for the input of `shape`:
    densely for small tables, else gathered, each device its own rows when `tensor` splits
    them."""
    if self.dense_read:
      return self._matrix_read(value_weights(weights_nhk, ids_nhk, values_vd.shape[0]),
                               values_vd, shape)
    if split_over_tensor(values_vd.shape[0]):
      seq_len = shape[-2] if sequence_parallel.active() else None
      return gathered_value_sum_over_tensor(weights_nhk, ids_nhk, values_vd, seq_len)
    return weighted_value_sum(weights_nhk, ids_nhk, values_vd, dense=False)

  @staticmethod
  def _matrix_read(weights_nv: jax.Array, values_vd: jax.Array,
                   shape: tuple[int, ...]) -> jax.Array:
    """`weights @ values` for the input of `shape`; under sequence parallelism, with the
    value rows split over `tensor`, each device's partial sums reduce-scattered along T."""
    if sequence_parallel.active() and split_over_tensor(values_vd.shape[0]):
      return sequence_parallel.row_parallel(
          jnp.matmul, [(weights_nv.reshape(*shape[:-1], -1), ("batch", None, "mlp"))],
          [(values_vd, ("mlp", "embed"))])
    return weights_nv @ values_vd

  def _activate(self, scores_nm: jax.Array) -> jax.Array:
    """ReLU, or a softmax over each row (all heads x knn, or all values)."""
    if self.activation == "relu":
      return jax.nn.relu(scores_nm)
    return jax.nn.softmax(scores_nm, axis=-1)

  def flops_per_token(self) -> int:
    """Sub-key scores of both halves for every head, then `knn` values per head (the whole
    table, `n^2` values, on the dense path)."""
    values_read = self.n_subkeys ** 2 if self.dense_path else self.n_heads * self.knn
    return self.n_heads * self.n_subkeys * self.d_model + values_read * self.d_model
