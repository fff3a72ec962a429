"""Top-K activation (sigma-MoE paper Sec. 3.1, Eq. 6-7).

Under tensor parallelism (`sparse_jax.parallel`) the hidden units are split over `tensor` as
the dense FF's are (`w_up`'s columns, `w_down`'s rows: `mlp`), and the top-K of a token is
taken across the devices without gathering its `d_ff` hidden units (which XLA's partitioner
does for a plain `top_k` on a split dimension: `B x T x d_ff` per layer, 4 times the
all-reduce of `B x T x d` that the FF's down projection already costs). Each device keeps the
K largest of its own `d_ff / t` units, all-gathers those `[B, T, K]` candidate values, and
keeps the units of its own that win the top-K of the `t K` candidates (`split_top_k_mask`).
This is the same choice as one device's, ties included (`_local_winners`).
"""

import functools

import jax
import jax.numpy as jnp
from flax import nnx

from sparse_jax import parallel
from sparse_jax.layers.dense_ff import DenseFF
from sparse_jax.layers.feed_forward import split_over_tensor


def top_k_mask(u_nf: jax.Array, k: int) -> jax.Array:
  """True at the k largest entries of each row (ties broken by lowest index)."""
  _, idx_nk = jax.lax.top_k(u_nf, k)
  keep_nf = jnp.zeros(u_nf.shape, bool)
  return jnp.put_along_axis(keep_nf, idx_nk, True, axis=-1, inplace=False)


def _local_winners(u_nl: jax.Array, k: int) -> jax.Array:
  """Inside `shard_map`: `top_k_mask` of the whole rows, for this device's units `u [N, L]`
  of the rows split over `tensor`.

  The device's `m = min(k, L)` largest units are all-gathered device by device, so among
  equal values a candidate's position grows with its unit's global index; the top-K of those
  `t m` positions (ties to the lowest) is then one device's choice: a unit among the global
  top-K has fewer than K units above it (by value, then index), so it is among its own
  device's top `m`.
  """
  m = min(k, u_nl.shape[-1])
  values_nm, ids_nm = jax.lax.top_k(u_nl, m)
  candidates = jax.lax.all_gather(values_nm, parallel.TENSOR, axis=u_nl.ndim - 1, tiled=True)
  _, winners_nk = jax.lax.top_k(candidates, k)
  mine_nk = winners_nk - jax.lax.axis_index(parallel.TENSOR) * m
  chosen_nm = jnp.any(mine_nk[..., :, None] == jnp.arange(m), axis=-2)
  keep_nl = jnp.zeros(u_nl.shape, bool)
  return jnp.put_along_axis(keep_nl, ids_nm, chosen_nm, axis=-1, inplace=False)


def split_top_k_mask(u_nf: jax.Array, k: int) -> jax.Array:
  """`top_k_mask(u, k)`, with `u`'s last dimension split over the ambient mesh's `tensor`
  axis (the batch over the batch axes): one all-gather of `[N, min(k, F / t)]` values."""
  mesh = jax.sharding.get_abstract_mesh()
  spec = parallel.partition_spec(("batch",) + (None,) * (u_nf.ndim - 2) + ("mlp",),
                                 u_nf.shape, mesh)
  return jax.shard_map(functools.partial(_local_winners, k=k), in_specs=spec,
                       out_specs=spec)(u_nf)


def keep_top_k(u_nf: jax.Array, k: int) -> jax.Array:
  """Zeroes all but the k largest entries of each row (ties broken by lowest index); the
  choice made across the devices of `tensor` when the ambient mesh splits the rows
  (`split_top_k_mask`; the config check makes `tensor` divide `d_ff`)."""
  split = split_over_tensor(u_nf.shape[-1])
  keep_nf = (split_top_k_mask if split else top_k_mask)(jax.lax.stop_gradient(u_nf), k)
  return jnp.where(keep_nf, u_nf, 0)


class TopKFF(DenseFF):
  """The dense MLP whose hidden `u = ReLU(x W1 + b1)` keeps only its K largest units.

  Saves only the second matmul: the whole of u is needed to find the K largest. The hidden
  dropout acts after the top-K, or before it with `after_dropout` (the authors' code: the K
  largest of the dropped-out units).
  """

  def __init__(self, d_model: int, d_ff: int, k: int, *, n_layers: int, dropout: float = 0.0,
               after_dropout: bool = False, rngs: nnx.Rngs):
    super().__init__(d_model, d_ff, n_layers=n_layers, dropout=dropout, rngs=rngs)
    self.k, self.after_dropout = k, after_dropout

  def hidden(self, pre_btf: jax.Array) -> jax.Array:
    u_btf = jax.nn.relu(pre_btf)
    if self.after_dropout:
      return keep_top_k(self.dropout(u_btf), self.k)
    return self.dropout(keep_top_k(u_btf, self.k))

  def flops_per_token(self) -> int:
    """The full up projection plus K rows of the down projection."""
    return self.d_model * self.d_ff + self.k * self.d_model
