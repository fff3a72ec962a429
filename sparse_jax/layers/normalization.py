"""Layer normalisation over the model width."""

from flax import nnx

from sparse_jax.layers.param_types import LayerNormParam, retype_params


def layer_norm(d_model: int, *, epsilon: float = 1e-6, rngs: nnx.Rngs) -> nnx.LayerNorm:
  """`nnx.LayerNorm(d_model)` whose scale and bias are `LayerNormParam`s (fine-tuning methods
  select them by type) declaring the logical axis `embed` (`sparse_jax.parallel`)."""
  axes = {"logical_axes": ("embed",)}
  return retype_params(nnx.LayerNorm(d_model, epsilon=epsilon, scale_metadata=axes,
                                     bias_metadata=axes, rngs=rngs), LayerNormParam)
