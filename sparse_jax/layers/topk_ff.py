"""Top-K activation (sigma-MoE paper Sec. 3.1, Eq. 6-7)."""

import jax
import jax.numpy as jnp
from flax import nnx

from sparse_jax.layers.dense_ff import DenseFF


def keep_top_k(u_nf: jax.Array, k: int) -> jax.Array:
  """Zeroes all but the k largest entries of each row (ties broken by lowest index)."""
  _, idx_nk = jax.lax.top_k(u_nf, k)
  keep_nf = jnp.zeros(u_nf.shape, bool)
  keep_nf = jnp.put_along_axis(keep_nf, idx_nk, True, axis=-1, inplace=False)
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
