"""The multiplicative dense layer of Scaling Transformers (Sec. 3.2; Trax `FactoredDense`)."""

import jax
import jax.numpy as jnp
from flax import nnx

from sparse_jax.layers import initializers


class MultiplicativeDense(nnx.Module):
  """`y[s, m] = sum_i x[i] D[i, s] E[i, m]`, output `[..., S * M]` with `M = d_out / S`.

  `d_in * (S + M)` parameters instead of `d_in * d_out`, yet any permutation of the input
  into the `S x M` output grid is representable (the paper's Theorem 1).

  `out_axes` are the logical axes of S and M (`sparse_jax.parallel`): heads and their
  channels in the sparse QKV layer, the vocabulary's two factors in the output layer.
  """

  def __init__(self, d_in: int, d_out: int, n_modules: int, *,
               out_axes: tuple[str, str] = ("heads", "head_dim"), rngs: nnx.Rngs):
    if d_out % n_modules:
      raise ValueError(f"d_out={d_out} must be divisible by n_modules={n_modules}.")
    self.d_in, self.d_out, self.n_modules = d_in, d_out, n_modules
    module_size = d_out // n_modules
    # var(y) = d_in var(D) var(E) var(x): unit-variance D, E at 1/d_in keeps the scale.
    self.d_is = nnx.Param(initializers.normal(1.0)(rngs.params(), (d_in, n_modules)),
                          logical_axes=("embed", out_axes[0]))
    self.e_im = nnx.Param(initializers.normal(d_in ** -0.5)(rngs.params(),
                                                             (d_in, module_size)),
                          logical_axes=("embed", out_axes[1]))

  def __call__(self, x: jax.Array) -> jax.Array:
    dtype = x.dtype
    y_sm = jnp.einsum("...i,is,im->...sm", x, self.d_is[...].astype(dtype),
                      self.e_im[...].astype(dtype))
    return y_sm.reshape(*x.shape[:-1], self.d_out)

  def flops_per_token(self) -> int:
    """`x * D` then `(x D) * E` summed over i: `d_in * (S + S * M)` multiply-adds."""
    return self.d_in * (self.n_modules + self.d_out)
