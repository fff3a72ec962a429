"""Bidirectional multi-head self-attention with biases: the attention of BERT and RoBERTa.

    q, k, v = x W_q + b_q, x W_k + b_k, x W_v + b_v      (per head)
    out = concat_h softmax(q k^T / sqrt(Dh) + padding mask) v,   y = out W_o + b_o

Every position attends to every non-padding key. The projections are `nnx.Linear`s whose
`kernel [d_in, d_out]` is the transpose of a PyTorch `nn.Linear.weight`, which is all the
Hugging Face importer needs to know.
"""

import jax
from flax import nnx

from sparse_jax.layers.causal_attention import attend


class Linear(nnx.Linear):
  """`nnx.Linear` computing in its input's dtype (the float32 kernel and bias cast to it), as
  every layer here does, so a bfloat16 input gives a bfloat16 matmul (`layers.precision`)."""

  def __call__(self, x: jax.Array) -> jax.Array:
    y = x @ self.kernel[...].astype(x.dtype)
    return y if self.bias is None else y + self.bias[...].astype(x.dtype)


def normal_linear(d_in: int, d_out: int, std: float, rngs: nnx.Rngs, *,
                  axes: tuple[str, str]) -> Linear:
  """A biased `Linear` with `N(0, std^2)` weights and zero bias (BERT's init).

  `axes` are the logical axes of its input and output (`sparse_jax.parallel`).
  """
  return Linear(d_in, d_out, kernel_init=jax.nn.initializers.normal(std),
                    kernel_metadata={"logical_axes": axes},
                    bias_metadata={"logical_axes": axes[1:]}, rngs=rngs)


class BidirectionalSelfAttention(nnx.Module):
  """`y = attn(x_btd, valid_bt)`; `valid_bt` (bool) marks the keys that may be attended."""

  def __init__(self, d_model: int, n_heads: int, *, attn_dropout: float = 0.0,
               init_std: float = 0.02, rngs: nnx.Rngs):
    self.n_heads, self.head_dim = n_heads, d_model // n_heads
    # Heads and their channels share one flattened `heads` dimension.
    in_axes, out_axes = ("embed", "heads"), ("heads", "embed")
    self.query = normal_linear(d_model, d_model, init_std, rngs, axes=in_axes)
    self.key = normal_linear(d_model, d_model, init_std, rngs, axes=in_axes)
    self.value = normal_linear(d_model, d_model, init_std, rngs, axes=in_axes)
    self.out = normal_linear(d_model, d_model, init_std, rngs, axes=out_axes)
    self.dropout = nnx.Dropout(attn_dropout, rngs=rngs)

  def _heads(self, x_btd: jax.Array) -> jax.Array:
    return x_btd.reshape(*x_btd.shape[:2], self.n_heads, self.head_dim)

  def __call__(self, x_btd: jax.Array, valid_bt: jax.Array) -> jax.Array:
    q_bthc, k_bthc, v_bthc = (self._heads(proj(x_btd))
                              for proj in (self.query, self.key, self.value))
    mask_b11k = valid_bt[:, None, None, :]
    out_bthc = attend(q_bthc, k_bthc, v_bthc, mask_b11k, self.dropout)
    return self.out(out_bthc.reshape(x_btd.shape))
