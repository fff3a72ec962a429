"""The multiplicative dense layer of Scaling Transformers (Sec. 3.2; Trax `FactoredDense`)."""

import jax
import jax.numpy as jnp
from flax import nnx

from sparse_jax import validation

# "trax": D ~ N(0, 0.5^2) (Trax's gating vectors), E Glorot-uniform over `[d_in, M]`
# (limit sqrt(6 / (d_in + M))), as Trax 1.4 `FactoredDense`.
# "unit": D ~ N(0, 1), E ~ N(0, 1/d_in), so that var(y) = var(x) (this library's earlier init).
INITS = ("trax", "unit")


def init_factors(d_in: int, n_modules: int, module_size: int, init: str,
                 rngs: nnx.Rngs) -> tuple[jax.Array, jax.Array]:
  """`D [d_in, S]` and `E [d_in, M]` drawn with the `init` scheme (see `INITS`)."""
  validation.require_choice(init, "init", INITS)
  if init == "trax":
    d_init, e_init = jax.nn.initializers.normal(0.5), jax.nn.initializers.glorot_uniform()
  else:
    d_init, e_init = jax.nn.initializers.normal(1.0), jax.nn.initializers.normal(d_in ** -0.5)
  return (d_init(rngs.params(), (d_in, n_modules)),
          e_init(rngs.params(), (d_in, module_size)))


class MultiplicativeDense(nnx.Module):
  """`y[s, m] = sum_i x[i] D[i, s] E[i, m] (+ b[s M + m])`, output `[..., S * M]`, `M = d_out / S`.

  `d_in * (S + M)` parameters (plus `d_out` with `use_bias`) instead of `d_in * d_out`, yet any
  permutation of the input into the `S x M` output grid is representable (the paper's
  Theorem 1). Trax's `FactoredDense` stores the gating vectors as `[S, d_in]` (our `D^T`) and
  adds a `[d_out]` bias (drawn N(0, 1e-6^2) there, zeros here: the same in effect); the sparse
  QKV layer uses it with the bias, the LM's sparse output layer without (it has its own).

  `out_axes` are the logical axes of S and M (`sparse_jax.parallel`): modules and their
  channels in the sparse QKV layer, the vocabulary's modules and the tokens within one
  (`vocab_module`, never split) in the output layer; `bias_axis` that of the flat `[d_out]` bias. Under tensor parallelism the
  LM's output layer is split by module over `tensor` (the config check makes `tensor` divide
  S): each device computes whole vocabulary blocks `[s M, (s + 1) M)`, as the dense output
  layer's vocabulary is split, so the loss reads its logits split. There `E` is whole on
  every device (split over `tensor` too, it was all-gathered before every product); its
  gradient, a sum over every device's modules, is all-reduced.
  """

  def __init__(self, d_in: int, d_out: int, n_modules: int, *,
               out_axes: tuple[str, str] = ("heads", "head_dim"), use_bias: bool = False,
               bias_axis: str = "embed", init: str = "trax", rngs: nnx.Rngs):
    if d_out % n_modules:
      raise ValueError(f"d_out={d_out} must be divisible by n_modules={n_modules}.")
    self.d_in, self.d_out, self.n_modules = d_in, d_out, n_modules
    d_is, e_im = init_factors(d_in, n_modules, d_out // n_modules, init, rngs)
    self.d_is = nnx.Param(d_is, logical_axes=("embed", out_axes[0]))
    self.e_im = nnx.Param(e_im, logical_axes=("embed", out_axes[1]))
    self.bias = (nnx.Param(jnp.zeros((d_out,)), logical_axes=(bias_axis,)) if use_bias
                 else None)

  def __call__(self, x: jax.Array) -> jax.Array:
    """`[..., d_in] -> [..., d_out]`, flattened module-major (`s * M + m`)."""
    dtype = x.dtype
    y_sm = jnp.einsum("...i,is,im->...sm", x, self.d_is[...].astype(dtype),
                      self.e_im[...].astype(dtype))
    y = y_sm.reshape(*x.shape[:-1], self.d_out)
    return y if self.bias is None else y + self.bias[...].astype(dtype)

  def flops_per_token(self) -> int:
    """`x * D` then `(x D) * E` summed over i: `d_in * (S + S * M)` multiply-adds."""
    return self.d_in * (self.n_modules + self.d_out)
