"""Sparse feed-forward layer of Scaling Transformers (Sec. 3.1).

`d_ff` is split into `d_ff / N` blocks of N units, of which exactly one per block may be
non-zero. A low-rank controller `x C1 C2 + c` scores the units of each block:

    Y_sparse = ReLU(x W1 + b1) * Controller(x),     SparseFF(x) = Y_sparse W2 + b2.

Training uses Gumbel noise (times `temperature`) and, with probability `quant_prob` per call,
the hard one-hot mask with a straight-through estimator, otherwise the soft softmax mask.
Evaluation uses the argmax. Decoding (`decode`) reads only the chosen column of W1 and row of
W2 per block: `2 d_model d_ff / N` multiply-adds instead of `2 d_model d_ff`.
"""

import jax
import jax.numpy as jnp
from flax import nnx

from sparse_jax.layers import initializers
from sparse_jax.layers.feed_forward import FeedForward


def straight_through(hard: jax.Array, soft: jax.Array) -> jax.Array:
  """Forward value `hard`, gradient of `soft`."""
  return hard + soft - jax.lax.stop_gradient(soft)


class SparseFF(FeedForward):
  """FF contract `y, aux = ff(x)`; `decode(x)` is the sparse inference path."""

  has_sparse_decode = True

  def __init__(self, d_model: int, d_ff: int, block_size: int, d_lowrank: int, *,
               n_layers: int = 1, temperature: float = 0.1, quant_prob: float = 0.3,
               rngs: nnx.Rngs):
    if d_ff % block_size:
      raise ValueError(f"d_ff={d_ff} must be divisible by block_size={block_size}.")
    self.d_model, self.d_ff, self.block_size, self.d_lowrank = d_model, d_ff, block_size, d_lowrank
    self.temperature, self.quant_prob = temperature, quant_prob
    up = initializers.normal(initializers.depth_scaled_std(d_model, n_layers))
    down = initializers.normal(initializers.depth_scaled_std(d_ff, n_layers))
    # W1 is stored transposed, one row per hidden unit, so that decoding gathers whole
    # contiguous rows of both matrices.
    self.w_keys = nnx.Param(up(rngs.params(), (d_ff, d_model)),  # W1^T
                            logical_axes=("mlp", "embed"))
    self.b_up = nnx.Param(jnp.zeros((d_ff,)), logical_axes=("mlp",))
    self.w_values = nnx.Param(down(rngs.params(), (d_ff, d_model)),  # W2
                              logical_axes=("mlp", "embed"))
    self.b_down = nnx.Param(jnp.zeros((d_model,)), logical_axes=("embed",))
    self.c_down = nnx.Param(initializers.normal(d_model ** -0.5)(rngs.params(),
                                                                 (d_model, d_lowrank)),
                            logical_axes=("embed", "lowrank"))
    self.c_up = nnx.Param(initializers.normal(d_lowrank ** -0.5)(rngs.params(),
                                                                 (d_lowrank, d_ff)),
                          logical_axes=("lowrank", "mlp"))
    self.c_bias = nnx.Param(jnp.zeros((d_ff,)), logical_axes=("mlp",))
    self.deterministic = False
    self.rngs = rngs["routing"].fork()

  def controller_logits(self, x: jax.Array) -> jax.Array:
    """`[..., d_ff / N, N]` block scores `x C1 C2 + c` (no nonlinearity between)."""
    logits = (x @ self.c_down[...].astype(x.dtype)) @ self.c_up[...].astype(x.dtype)
    logits = logits.astype(jnp.float32) + self.c_bias[...]
    return logits.reshape(*x.shape[:-1], self.d_ff // self.block_size, self.block_size)

  def mask(self, x: jax.Array) -> jax.Array:
    """`[..., d_ff]`: one-hot per block in eval; Gumbel soft / straight-through in training."""
    logits = self.controller_logits(x)
    if self.deterministic:
      hard = jax.nn.one_hot(jnp.argmax(logits, -1), self.block_size, dtype=jnp.float32)
      return hard.reshape(*x.shape[:-1], self.d_ff)
    gumbel_key, quant_key = jax.random.split(self.rngs())
    noisy = logits + self.temperature * jax.random.gumbel(gumbel_key, logits.shape)
    soft = jax.nn.softmax(noisy, axis=-1)
    hard = jax.nn.one_hot(jnp.argmax(noisy, -1), self.block_size, dtype=soft.dtype)
    use_hard = jax.random.bernoulli(quant_key, self.quant_prob)
    mask = jnp.where(use_hard, straight_through(hard, soft), soft)
    return mask.reshape(*x.shape[:-1], self.d_ff)

  def __call__(self, x: jax.Array) -> tuple[jax.Array, dict[str, jax.Array]]:
    dtype = x.dtype
    h = jax.nn.relu(x @ self.w_keys[...].T.astype(dtype) + self.b_up[...].astype(dtype))
    h = h * self.mask(x).astype(dtype)
    y = h @ self.w_values[...].astype(dtype) + self.b_down[...].astype(dtype)
    return y, {"reg_loss": jnp.zeros((), jnp.float32)}

  def decode(self, x: jax.Array) -> jax.Array:
    """Eval output reading only the chosen unit's W1 column and W2 row in every block."""
    dtype = x.dtype
    choice = jnp.argmax(self.controller_logits(x), axis=-1)  # [..., blocks]
    units = jnp.arange(0, self.d_ff, self.block_size) + choice  # [..., blocks]
    keys_kd = jnp.take(self.w_keys[...], units, axis=0).astype(dtype)  # [..., blocks, d]
    pre = jnp.einsum("...d,...kd->...k", x, keys_kd) + jnp.take(self.b_up[...], units)
    values_kd = jnp.take(self.w_values[...], units, axis=0).astype(dtype)  # [..., blocks, d]
    return jnp.einsum("...k,...kd->...d", jax.nn.relu(pre).astype(dtype),
                      values_kd) + self.b_down[...].astype(dtype)

  def flops_per_token(self) -> int:
    """Decoding multiply-adds: the controller plus one unit per block of each matmul."""
    controller = self.d_model * self.d_lowrank + self.d_lowrank * self.d_ff
    return controller + 2 * self.d_model * (self.d_ff // self.block_size)
