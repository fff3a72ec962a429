"""The dense two-layer feed-forward block: the baseline every sparse layer approximates."""

import jax
import jax.numpy as jnp
from flax import nnx

from sparse_jax.layers import initializers, sequence_parallel
from sparse_jax.layers.feed_forward import FeedForward


ACTIVATIONS = {"relu": jax.nn.relu,
               "gelu": lambda h: jax.nn.gelu(h, approximate=False),  # BERT/RoBERTa's (erf).
               "swish": jax.nn.silu}  # AdapterHub's Houlsby adapters.


class DenseFF(FeedForward):
  """`y = act(x W1 + b1) W2 + b2` (sigma-MoE paper Eq. 1), FF contract: `y, aux = ff(x)`.

  `activation` is "relu" (the sigma-MoE baseline) or "gelu" (exact, as in RoBERTa).
  Weights use the depth-scaled init of the sigma-MoE paper (Sec. 5): std
  `sqrt(2 / (fan_in * n_layers))`; biases start at zero. Dropout acts on the hidden units.
  """

  RESIDUAL_OUTPUTS = ("w_down",)  # Its projection into the residual stream.

  def __init__(self, d_model: int, d_ff: int, *, n_layers: int, dropout: float = 0.0,
               activation: str = "relu", rngs: nnx.Rngs):
    self.d_model, self.d_ff, self.activation_name = d_model, d_ff, activation
    std_up = initializers.depth_scaled_std(d_model, n_layers)
    std_down = initializers.depth_scaled_std(d_ff, n_layers)
    self.w_up = nnx.Param(jax.nn.initializers.normal(std_up)(rngs.params(), (d_model, d_ff)),
                          logical_axes=("embed", "mlp"))
    self.b_up = nnx.Param(jnp.zeros((d_ff,)), logical_axes=("mlp",))
    self.w_down = nnx.Param(jax.nn.initializers.normal(std_down)(rngs.params(), (d_ff, d_model)),
                            logical_axes=("mlp", "embed"))
    self.b_down = nnx.Param(jnp.zeros((d_model,)), logical_axes=("embed",))
    self.dropout = nnx.Dropout(dropout, rngs=rngs)

  def hidden(self, pre_btf: jax.Array) -> jax.Array:
    """The hidden units: the nonlinearity (`activation`), then dropout; subclasses sparsify."""
    return self.dropout(ACTIVATIONS[self.activation_name](pre_btf))

  def up(self, x_btd: jax.Array) -> jax.Array:
    """`u = hidden(x W1 + b1)` `[..., d_ff]`: the hidden units whose active channels the
    sigma-MoE paper counts (Fig. 1)."""
    dtype = x_btd.dtype
    pre_btf, = sequence_parallel.column_parallel(
        lambda x, w: (x @ w,), [x_btd], [(self.w_up[...].astype(dtype), ("embed", "mlp"))],
        [("batch", None, "mlp")])
    return self.hidden(pre_btf + self.b_up[...].astype(dtype))

  def __call__(self, x_btd: jax.Array) -> tuple[jax.Array, dict[str, jax.Array]]:
    dtype = x_btd.dtype
    h_btf = self.up(x_btd)
    y_btd = sequence_parallel.row_parallel(
        jnp.matmul, [(h_btf, ("batch", None, "mlp"))],
        [(self.w_down[...].astype(dtype), ("mlp", "embed"))])
    y_btd = y_btd + self.b_down[...].astype(dtype)
    return y_btd, {"reg_loss": jnp.zeros((), jnp.float32)}

  def flops_per_token(self) -> int:
    """Multiply-adds per token of the two matmuls."""
    return 2 * self.d_model * self.d_ff
