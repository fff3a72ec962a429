"""The low-rank SRU branch of Terraformer (Scaling Transformers Sec. 4.3; Trax 1.4 `SRU`).

Terraformer adds a small recurrence beside each feed-forward block so that information can
flow along the sequence inside one block, which is what lets it generalise to longer inputs
on the copy and addition tasks (Table 4):

    out = FF(LN x) + Dense_d(SRU_r(Dense_r(LN x)))

This module is the branch `x -> Dense_d(SRU_r(Dense_r(x)))`, `[B, T, d_model] -> [B, T,
d_model]`, with `r = d_lowrank` (32 in the paper: a full-width SRU would cost as much as the
dense layers that sparsity removed). The block owns the LayerNorm and the sum. Trax builds it
in `configurable_transformer.FeedForwardWithOptions` (`ff_use_sru=(1, 32)`): `Residual(
[LayerNorm, Dense(32), SRU(32), Dense(d_model)], shortcut=FF)`.

The SRU cell is Trax's `trax/layers/rnn.py` `SRU(n_units, activation=None)`. On its input
`u_t = Dense_r(x)_t` (r channels), one dense layer `u_t W + b` (`W [r, 3r]`) is split into
`(r_t, f_t, y_t)`, in that order:

    r_t = sigmoid(.),  f_t = sigmoid(.),  y_t             (no bias offset on the gates)
    c_t = f_t * c_{t-1} + (1 - f_t) * y_t,   c_0 = 0       (`MakeZeroState`, `InnerSRUCell`)
    h_t = r_t * c_t + (1 - r_t) * u_t * sqrt(3)           (`FinalSRUGate`)

No activation is applied to `c_t` (Trax's default `activation=None`, which `ff_use_sru`
keeps), and the highway term uses the SRU's own input `u_t`, the low-rank projection.

Training runs the recurrence, a linear one `c_t = a_t c_{t-1} + b_t` with `a = f` and
`b = (1 - f) y`, as `jax.lax.associative_scan` over the length (log-depth, parallel), where
Trax runs a sequential `Scan`. Decoding (`init_cache`, `decode`) steps one token at a time.
The cell computes in float32 at least, whatever the input dtype, so that a long product of
forget gates keeps its precision; the carry is held in that dtype too.

Init: the three kernels use the depth-scaled normal of our dense layers, std
`sqrt(2 / (fan_in * n_layers))` (`initializers.depth_scaled_std`), biases start at zero.
Trax uses its `Dense` defaults: Glorot-uniform kernels and N(0, 1e-6^2) biases.
"""

import math

import jax
import jax.numpy as jnp
from flax import nnx

from sparse_jax.layers import initializers

HIGHWAY_SCALE = math.sqrt(3.0)  # Trax `FinalSRUGate`: keeps the highway term's variance.


def cell_dtype(dtype) -> jnp.dtype:
  """The dtype the SRU cell and its carry use: `dtype`, at least float32."""
  return jnp.promote_types(dtype, jnp.float32)


def linear_recurrence(a_btr: jax.Array, b_btr: jax.Array, c0_br: jax.Array) -> jax.Array:
  """All states `c [B, T, r]` of `c_t = a_t * c_{t-1} + b_t` from `c_{-1} = c0`.

  An associative scan over the length: the step `c -> a c + b` is the pair `(a, b)`, and
  applying `(a1, b1)` then `(a2, b2)` is `(a1 a2, a2 b1 + b2)`. The initial state is folded
  into the first step's offset.
  """
  b_btr = b_btr.at[:, 0].add(a_btr[:, 0] * c0_br)

  def compose(earlier, later):
    a1, b1 = earlier
    a2, b2 = later
    return a1 * a2, a2 * b1 + b2

  _, c_btr = jax.lax.associative_scan(compose, (a_btr, b_btr), axis=1)
  return c_btr


class LowRankSRU(nnx.Module):
  """`Dense_d(SRU_r(Dense_r(x)))`: `[B, T, d_model] -> [B, T, d_model]` (module docstring).

  `n_layers` is the model's depth, for the depth-scaled init (as in `DenseFF`). Parameters:
  `w_down [d_model, r]`, `b_down [r]`; the SRU's `w_gates [r, 3r]`, `b_gates [3r]` (gates r, f,
  y in that order along the last axis, Trax's layout); `w_up [r, d_model]`, `b_up [d_model]`.
  """

  def __init__(self, d_model: int, d_lowrank: int = 32, *, n_layers: int, rngs: nnx.Rngs):
    self.d_model, self.d_lowrank = d_model, d_lowrank
    r = d_lowrank
    down = jax.nn.initializers.normal(initializers.depth_scaled_std(d_model, n_layers))
    lowrank = jax.nn.initializers.normal(initializers.depth_scaled_std(r, n_layers))
    self.w_down = nnx.Param(down(rngs.params(), (d_model, r)), logical_axes=("embed", "lowrank"))
    self.b_down = nnx.Param(jnp.zeros((r,)), logical_axes=("lowrank",))
    self.w_gates = nnx.Param(lowrank(rngs.params(), (r, 3 * r)),
                             logical_axes=("lowrank", "lowrank"))
    self.b_gates = nnx.Param(jnp.zeros((3 * r,)), logical_axes=("lowrank",))
    self.w_up = nnx.Param(lowrank(rngs.params(), (r, d_model)), logical_axes=("lowrank", "embed"))
    self.b_up = nnx.Param(jnp.zeros((d_model,)), logical_axes=("embed",))

  def project_down(self, x_btd: jax.Array) -> jax.Array:
    """The SRU input `u = x W_down + b_down`, `[B, T, r]`, in the cell dtype."""
    dtype = x_btd.dtype
    u_btr = x_btd @ self.w_down[...].astype(dtype) + self.b_down[...].astype(dtype)
    return u_btr.astype(cell_dtype(dtype))

  def gates(self, u_btr: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """The reset gate r, forget gate f and candidate y, each `[B, T, r]`, from `u`."""
    dtype = u_btr.dtype
    pre = u_btr @ self.w_gates[...].astype(dtype) + self.b_gates[...].astype(dtype)
    r_btr, f_btr, y_btr = jnp.split(pre, 3, axis=-1)
    return jax.nn.sigmoid(r_btr), jax.nn.sigmoid(f_btr), y_btr

  def project_up(self, h_btr: jax.Array, dtype) -> jax.Array:
    """The branch output `h W_up + b_up`, `[B, T, d_model]`, in `dtype`."""
    h_btr = h_btr.astype(dtype)
    return h_btr @ self.w_up[...].astype(dtype) + self.b_up[...].astype(dtype)

  def forward(self, x_btd: jax.Array, carry_br: jax.Array) -> tuple[jax.Array, jax.Array]:
    """`(y [B, T, d_model], carry [B, r])`: the branch over `x` from the SRU state `carry`,
    and the state after the last token (to continue with `forward` or `decode`)."""
    u_btr = self.project_down(x_btd)
    r_btr, f_btr, y_btr = self.gates(u_btr)
    c_btr = linear_recurrence(f_btr, (1.0 - f_btr) * y_btr, carry_br.astype(u_btr.dtype))
    h_btr = r_btr * c_btr + (1.0 - r_btr) * u_btr * HIGHWAY_SCALE
    return self.project_up(h_btr, x_btd.dtype), c_btr[:, -1]

  def __call__(self, x_btd: jax.Array) -> jax.Array:
    """`[B, T, d_model] -> [B, T, d_model]` from the zero state (training, as Trax)."""
    carry_br = self.init_cache(x_btd.shape[0], x_btd.dtype)
    return self.forward(x_btd, carry_br)[0]

  def init_cache(self, batch: int, dtype) -> jax.Array:
    """The zero SRU state `c [batch, r]` for decoding, in `cell_dtype(dtype)`."""
    return jnp.zeros((batch, self.d_lowrank), cell_dtype(dtype))

  def decode(self, x_b1d: jax.Array, carry_br: jax.Array) -> tuple[jax.Array, jax.Array]:
    """One token: `(y [B, 1, d_model], carry [B, r])`, one step of the recurrence."""
    u_br = self.project_down(x_b1d)[:, 0]
    r_br, f_br, y_br = self.gates(u_br)
    c_br = f_br * carry_br.astype(u_br.dtype) + (1.0 - f_br) * y_br
    h_br = r_br * c_br + (1.0 - r_br) * u_br * HIGHWAY_SCALE
    return self.project_up(h_br[:, None], x_b1d.dtype), c_br

  def flops_per_token(self) -> int:
    """Multiply-adds per token of the three matmuls (down, gates, up); the O(r) gate
    arithmetic is not counted, as biases and activations are not elsewhere."""
    r = self.d_lowrank
    return self.d_model * r + r * 3 * r + r * self.d_model
