"""The contract of the layers that fill a block's feed-forward slot."""

from typing import ClassVar

import jax
from flax import nnx

from sparse_jax import parallel


def split_over_tensor(size: int) -> bool:
  """Whether the ambient mesh (`jax.set_mesh`) splits a dimension of `size` over `tensor`:
  its `tensor` axis is larger than 1 and divides `size` (`parallel.RULES` leave it whole
  otherwise)."""
  tensor = parallel.axis_size(jax.sharding.get_abstract_mesh(), parallel.TENSOR)
  return tensor > 1 and size % tensor == 0


class FeedForward(nnx.Module):
  """Base of every feed-forward layer (`model.ff.kind`) and of the SPARTAN memory block.

  A subclass provides `y, aux = layer(x)` with `x, y: [..., d_model]` and `aux["reg_loss"]` a
  scalar already multiplied by the layer's coefficient, and `flops_per_token()`, its
  multiply-adds per token. `has_sparse_decode` declares a cheaper evaluation path
  `y = layer.decode(x)` (same shapes, no aux) that a model takes when decoding.
  """

  has_sparse_decode: ClassVar[bool] = False

  def token_rows(self, x: jax.Array, d_model: int) -> jax.Array:
    """`x [..., d_model]` as token rows `[N, d_model]`; raises `ValueError` naming the layer
    if its last axis is not `d_model` (a bare reshape would fold a wrong width into other
    rows without an error)."""
    if x.ndim < 1 or x.shape[-1] != d_model:
      raise ValueError(f"{type(self).__name__}: x must have shape [..., d_model={d_model}], "
                       f"got {x.shape}")
    return x.reshape(-1, d_model)
