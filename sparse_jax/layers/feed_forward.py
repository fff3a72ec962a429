"""The contract of the layers that fill a block's feed-forward slot."""

from typing import ClassVar

from flax import nnx


class FeedForward(nnx.Module):
  """Base of every feed-forward layer (`model.ff.kind`) and of the SPARTAN memory block.

  A subclass provides `y, aux = layer(x)` with `x, y: [..., d_model]` and `aux["reg_loss"]` a
  scalar already multiplied by the layer's coefficient, and `flops_per_token()`, its
  multiply-adds per token. `has_sparse_decode` declares a cheaper evaluation path
  `y = layer.decode(x)` (same shapes, no aux) that a model takes when decoding.
  """

  has_sparse_decode: ClassVar[bool] = False
