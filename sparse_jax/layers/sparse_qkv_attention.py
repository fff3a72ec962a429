"""Sparse QKV attention of Scaling Transformers (Sec. 3.2; Trax MultiplicativeConvCausalAttention).

The dense Q, K, V and output layers are replaced by

    y = mult(x)                                       [B, T, S, M], M = d_model / S
    Q = conv_Q(y),  K = conv_K(y),  V = conv_V(y)     [B, T, S, M] -> [B, T, d_model]
                                                      -> [B, T, H, d_model / H] (heads)
    out = concat_h softmax(Q_h K_h^T / sqrt(d_model / H) + causal mask) V_h   (no output layer)

`mult` is one `MultiplicativeDense` (with a `[d_model]` bias, as Trax's `FactoredDense`) shared
by Q, K and V; it can route any input feature to any module (the paper's Theorem 1), so each
head may read any part of the embedding. Each `conv` is a 2-D convolution over the (length,
module) "image" with M channels in and M filters out: causal along the length (the current and
`F_len - 1` previous tokens, zero padded on the left), centred along the modules (`F_mod`
neighbours, zero padded), plus a bias. Q and K use 3 x 3 and V 3 x 1 as in Trax.

The sparsity S (`n_modules`) defaults to the number of heads H, so that module s is head s.
Trax allows S != H (its 17B model: 96 heads, S = 64): the convolutions' `[S, M]` outputs are
flattened to `d_model` and split into H heads of `d_model / H` channels (Trax's
`MergeLastTwoAxes` then `SplitIntoHeads`), so a head may straddle modules.

Decoding keeps the keys and values `[B, H, max_len, d_model / H]` as in dense attention, plus
the last `F - 1` outputs `[B, F - 1, S, M]` of the multiplicative layer (F the largest
`F_len`): exactly the convolutions' causal window (Trax's `_RememberPad`).

Tensor parallelism (`mesh.tensor` = t, `sparse_jax.parallel`): split by module and head. Each
device holds `S / t` columns of `D` (and their bias), so `mult` is column-parallel and yields
that device's modules with no communication (`E`, shared by all modules, is replicated); the
module convolutions read one neighbouring module on each side, which XLA's partitioner brings
from the neighbouring devices (a collective-permute of `B x T x M` per side for Q and K, none
for V's 3 x 1); the heads, whole on one device when t divides both S and H (their boundaries
then coincide at the devices' edges), attend locally, their caches split by head; and the
output, with no output layer to reduce it, is all-gathered once (`gathered_heads`). The
backward pass all-reduces `mult`'s input gradient and the replicated weights' gradients.
"""

import jax
import jax.numpy as jnp
from flax import nnx

from sparse_jax import parallel
from sparse_jax.layers import initializers, sequence_parallel
from sparse_jax.layers.causal_attention import (attend, attend_cached, causal_mask,
                                                check_rotary_dim, init_kv_cache)
from sparse_jax.layers.multiplicative_dense import MultiplicativeDense
from sparse_jax.layers.rotary import apply_rotary


WINDOW_AXES = ("batch", None, "heads", None)  # Of the `mult` window `[B, F - 1, S, M]`.


def gathered_heads(out_btd: jax.Array) -> jax.Array:
  """The attention's output with its heads whole on every device of `mesh.tensor`.

  With no output layer there is no row-parallel product to all-reduce: the heads each device
  computed are all-gathered here, once (`B x T x d_model` per layer, half an all-reduce's
  traffic). Left to itself, XLA's partitioner carried the output split along `d_model`
  through the residual and the next LayerNorm and gathered it again before every matmul that
  reads it (one more all-gather per layer, and all-reduces of the LayerNorm statistics).
  """
  return parallel.constrain(out_btd, ("batch", None, None))


class CausalModuleConv(nnx.Module):
  """2-D convolution of `[B, T, S, M]` over (length, module), M channels to M filters.

  Kernel `[F_len, F_mod, M, M]` (length, module, in, out) and bias `[M]`; tap `F_len - 1` along
  the length is the current token.
  """

  def __init__(self, module_size: int, kernel: tuple[int, int], *, n_layers: int,
               rngs: nnx.Rngs):
    self.f_len, self.f_mod = kernel
    std = initializers.depth_scaled_std(self.f_len * self.f_mod * module_size, n_layers)
    self.kernel = nnx.Param(jax.nn.initializers.normal(std)(
        rngs.params(), (self.f_len, self.f_mod, module_size, module_size)),
        logical_axes=("conv", "conv", "head_dim", "head_dim"))
    self.bias = nnx.Param(jnp.zeros((module_size,)), logical_axes=("head_dim",))

  def convolve_window(self, y_bwsm: jax.Array) -> jax.Array:
    """Unpadded along the length: `W` input rows give outputs for the last `W - F_len + 1`.

    Along the modules the padding is 'SAME'-centred: `(F_mod - 1) // 2` zeros before.
    """
    dtype = y_bwsm.dtype
    mod_before = (self.f_mod - 1) // 2
    out_btsm = jax.lax.conv_general_dilated(
        y_bwsm, self.kernel[...].astype(dtype), window_strides=(1, 1),
        padding=((0, 0), (mod_before, self.f_mod - 1 - mod_before)),
        dimension_numbers=("NHWC", "HWIO", "NHWC"))
    return out_btsm + self.bias[...].astype(dtype)

  def __call__(self, y_btsm: jax.Array) -> jax.Array:
    """Whole sequence: `F_len - 1` zero tokens before the first, so output t sees t-F_len+1..t."""
    padded = jnp.pad(y_btsm, ((0, 0), (self.f_len - 1, 0), (0, 0), (0, 0)))
    return self.convolve_window(padded)

  def last(self, window_bwsm: jax.Array) -> jax.Array:
    """The output for the window's last token, `[B, 1, S, M]`, from its last `F_len` rows."""
    return self.convolve_window(window_bwsm[:, window_bwsm.shape[1] - self.f_len:])


class SparseQKVAttention(nnx.Module):
  """Multiplicative layer then causal (length, module) convolutions into H heads.

  `n_modules` is S (None: `n_heads`); `mult_init` the multiplicative layer's init
  (`multiplicative_dense.INITS`: "trax" default, "unit").
  """

  def __init__(self, d_model: int, n_heads: int, *, n_layers: int,
               n_modules: int | None = None, attn_dropout: float = 0.0,
               q_kernel: tuple[int, int] = (3, 3), k_kernel: tuple[int, int] = (3, 3),
               v_kernel: tuple[int, int] = (3, 1), rotary: bool = True,
               mult_init: str = "trax", rngs: nnx.Rngs):
    n_modules = n_heads if n_modules is None else n_modules
    for name, value in (("n_heads", n_heads), ("n_modules", n_modules)):
      if d_model % value:
        raise ValueError(f"d_model={d_model} must be divisible by {name}={value} "
                         "(the sparse QKV layer's heads and modules S).")
    self.d_model, self.n_heads, self.head_dim = d_model, n_heads, d_model // n_heads
    self.n_modules, self.module_size = n_modules, d_model // n_modules
    check_rotary_dim(rotary, self.head_dim)
    self.rotary = rotary
    # The flat bias is module-major, so splitting it by "heads" keeps it with its modules.
    self.mult = MultiplicativeDense(d_model, d_model, n_modules, use_bias=True,
                                    bias_axis="heads", init=mult_init, rngs=rngs)
    self.conv_q = CausalModuleConv(self.module_size, q_kernel, n_layers=n_layers, rngs=rngs)
    self.conv_k = CausalModuleConv(self.module_size, k_kernel, n_layers=n_layers, rngs=rngs)
    self.conv_v = CausalModuleConv(self.module_size, v_kernel, n_layers=n_layers, rngs=rngs)
    self.window = max(q_kernel[0], k_kernel[0], v_kernel[0]) - 1
    self.attn_dropout = nnx.Dropout(attn_dropout, rngs=rngs)

  def module_grid(self, x_btd: jax.Array) -> jax.Array:
    """The shared multiplicative layer, `[B, T, d_model] -> [B, T, S, M]`."""
    return self.mult(x_btd).reshape(*x_btd.shape[:-1], self.n_modules, self.module_size)

  def to_heads(self, y_btsm: jax.Array) -> jax.Array:
    """`[B, T, S, M] -> [B, T, H, d_model / H]`: flatten to `d_model`, split into heads."""
    return y_btsm.reshape(*y_btsm.shape[:2], self.n_heads, self.head_dim)

  def rotate(self, q_bthc: jax.Array, k_bthc: jax.Array, positions_t: jax.Array):
    if self.rotary:
      return apply_rotary(q_bthc, positions_t), apply_rotary(k_bthc, positions_t)
    return q_bthc, k_bthc

  def __call__(self, x_btd: jax.Array) -> jax.Array:
    """Causal self-attention over the sequence, `[B, T, d_model] -> [B, T, d_model]`; under
    sequence parallelism (`layers.sequence_parallel`) from and to sequence shards, the
    input read whole."""
    b, t, _ = x_btd.shape
    sequence = sequence_parallel.active()
    if sequence:
      x_btd = parallel.whole_sequences(x_btd)
    y_btsm = self.module_grid(x_btd)
    q_bthc, k_bthc = self.rotate(self.to_heads(self.conv_q(y_btsm)),
                                 self.to_heads(self.conv_k(y_btsm)), jnp.arange(t))
    out_bthc = attend(q_bthc, k_bthc, self.to_heads(self.conv_v(y_btsm)), causal_mask(t),
                      self.attn_dropout)
    out_btd = out_bthc.reshape(b, t, self.d_model)
    if sequence:  # From split by head to sequence shards: an all-to-all, not an all-gather.
      return parallel.sequence_shards(out_btd)
    return gathered_heads(out_btd)

  def init_cache(self, batch: int, max_len: int, dtype) -> dict[str, jax.Array]:
    """Keys and values `[B, H, max_len, d_model / H]` and `mult`, the last `F - 1` layer
    outputs `[B, F - 1, S, M]`."""
    cache = init_kv_cache(batch, max_len, self.n_heads, self.head_dim, dtype)
    window_shape = (batch, self.window, self.n_modules, self.module_size)
    return {**cache, "mult": parallel.constrain(jnp.zeros(window_shape, dtype), WINDOW_AXES)}

  def decode(self, x_b1d: jax.Array, cache: dict, position: jax.Array) -> tuple[jax.Array, dict]:
    """One token at absolute `position`; calls must come at positions 0, 1, 2, ... in order.

    The `mult` window shifts by one row per call (zeros before position 0 are the causal
    padding of `__call__`), so only the keys and values are indexed by `position`.
    """
    b = x_b1d.shape[0]
    window_bwsm = jnp.concatenate(
        [cache["mult"].astype(x_b1d.dtype), self.module_grid(x_b1d)], axis=1)
    q_b1hc, k_b1hc = self.rotate(self.to_heads(self.conv_q.last(window_bwsm)),
                                 self.to_heads(self.conv_k.last(window_bwsm)),
                                 jnp.reshape(position, (1,)))
    out_b1hc, cache = attend_cached(q_b1hc, k_b1hc, self.to_heads(self.conv_v.last(window_bwsm)),
                                    cache, position, self.attn_dropout)
    cache = {**cache, "mult": window_bwsm[:, 1:].astype(cache["mult"].dtype)}
    return gathered_heads(out_b1hc.reshape(b, 1, self.d_model)), cache

  def flops_per_token(self) -> int:
    """Multiply-adds of the multiplicative layer and the three convolutions for one token.

    A convolution computes S modules of M outputs from `F_len F_mod M` inputs each (zero
    padding at the module edges counted as taps). Excludes the attention itself (`2 d_model`
    per visible key), the biases and the rotary rotation.
    """
    convs = (self.conv_q, self.conv_k, self.conv_v)
    return self.mult.flops_per_token() + self.n_modules * sum(c.kernel.size for c in convs)
