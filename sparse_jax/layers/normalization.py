"""Layer normalisation over the model width, in float32 whatever the compute dtype."""

from flax import nnx

from sparse_jax.layers.param_types import LayerNormParam, retype_params


class LayerNorm(nnx.LayerNorm):
  """`nnx.LayerNorm` whose output keeps its input's dtype: statistics and the affine map in
  float32 (the parameters' dtype), the result cast back, so a bfloat16 residual stream stays
  bfloat16 into the next matmul instead of being promoted to float32 by the parameters."""

  def __call__(self, x, *args, **kwargs):
    return super().__call__(x, *args, **kwargs).astype(x.dtype)


def layer_norm(d_model: int, *, epsilon: float = 1e-6, rngs: nnx.Rngs) -> LayerNorm:
  """A `LayerNorm(d_model)` whose scale and bias are `LayerNormParam`s (fine-tuning methods
  select them by type) declaring the logical axis `embed` (`sparse_jax.parallel`)."""
  axes = {"logical_axes": ("embed",)}
  return retype_params(LayerNorm(d_model, epsilon=epsilon, scale_metadata=axes,
                                 bias_metadata=axes, rngs=rngs), LayerNormParam)
