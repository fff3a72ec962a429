"""Sparse feed-forward layer of Scaling Transformers (Sec. 3.1; Trax 1.4 `SparseFF`).

`d_ff` is split into `d_ff / N` blocks of N units, of which exactly one per block may be
non-zero. A low-rank controller `x C1 C2 + c` (no nonlinearity between) scores the units of
each block, and its mask `m` gates the hidden units:

    Trax (default, `mask_placement="pre_relu"`):   h = ReLU((x W1 [+ b1]) * m)
    paper text (`"post_relu"`):                   h = ReLU(x W1 + b1) * m
    SparseFF(x) = h W2 + b2.

The two agree in value for every mask here (m >= 0); they differ in the straight-through
gradient: before the ReLU, a unit the hard mask zeroes passes no gradient to its mask entry.
Trax has no `b1` (`up_bias=False`, the default); the paper has one (`up_bias=True`).

Training: the hard choice per block is `argmax(logits + temperature * Gumbel)`; with
probability `quant_prob` per call the mask is that one-hot with a straight-through estimator
(forward one-hot, backward the soft mask), otherwise the soft mask itself. The soft mask is
`softmax(logits)` of the clean logits in Trax (`soft_mask="clean"`, default), or
`softmax(logits + temperature * Gumbel)` with the same noise (`"noisy"`, this library's
earlier form). Evaluation uses `argmax(logits)`. Decoding (`decode`) reads only the chosen
column of W1 and row of W2 per block: `2 d_model d_ff / N` multiply-adds instead of
`2 d_model d_ff`.

Controller init: Glorot-uniform C1 `[d_model, d_lowrank]` and C2 `[d_lowrank, d_ff]` as Trax
(`controller_init="glorot"`), or N(0, 1/fan_in) (`"normal"`); its bias `c` starts at zero
(Trax: N(0, 1e-6^2)). W1 and W2 keep the depth-scaled init of our dense FF (Trax: Glorot).

Tensor parallelism (`mesh.tensor` = t, `sparse_jax.parallel`) splits the hidden units as
Megatron splits a dense FF's, and the controller's blocks with them: W1's columns, W2's rows,
`b1`, C2's columns and `c` by `d_ff`, whole blocks per device (t divides `d_ff / N`). C1 is
replicated, so each device scores, masks and (decoding) chooses within its own blocks without
communication; W2's partial products are all-reduced, once per layer as Megatron's FF.
"""

import jax
import jax.numpy as jnp
from flax import nnx

from sparse_jax import parallel, validation
from sparse_jax.layers import initializers, sequence_parallel
from sparse_jax.layers.feed_forward import FeedForward

SOFT_MASKS = ("clean", "noisy")
CONTROLLER_INITS = ("glorot", "normal")
MASK_PLACEMENTS = ("pre_relu", "post_relu")


def straight_through(hard: jax.Array, soft: jax.Array) -> jax.Array:
  """Forward value `hard`, gradient of `soft`."""
  return hard + soft - jax.lax.stop_gradient(soft)


def first_max_index(x: jax.Array) -> jax.Array:
  """`argmax(x, -1)` as int32 (the first maximum on ties), computed as the least index where
  `x` equals its maximum: XLA:CPU runs `jnp.argmax` as a scalar two-value reduction, about 2x
  slower at the 17B decode shape (`[264, 256]`: 0.22 vs 0.09 ms). A row holding NaN gives its
  last index (`jnp.argmax`: the first NaN's); its output is NaN either way."""
  n = x.shape[-1]
  is_max = x == jnp.max(x, axis=-1, keepdims=True)
  first = jnp.min(jnp.where(is_max, jnp.arange(n, dtype=jnp.int32), n), axis=-1)
  return jnp.minimum(first, n - 1)


def chosen_rows(w_u: jax.Array, choice: jax.Array, block_size: int) -> jax.Array:
  """Row `choice[..., k]` of block `k` of `w_u` (`[d_ff, ...]`, one row per hidden unit, blocks
  of `block_size` consecutive rows): `[..., d_ff / N, ...]`.

  A gather batched over the blocks, so that with the blocks split over `mesh.tensor` each
  device reads only its own blocks' rows: a flat `take` of `block * N + choice` made XLA's
  partitioner gather every device's chosen rows and all-reduce them (`2 d_ff / N` rows of
  `d_model` per token and layer). `choice` is in range by construction: "clip" spares the
  gather's out-of-range fill (a select over every gathered row).
  """
  w_kn = w_u.reshape(-1, block_size, *w_u.shape[1:])
  take = lambda w_n, c: jnp.take(w_n, c, axis=0, mode="clip")
  return jax.vmap(take, in_axes=(0, -1), out_axes=choice.ndim - 1)(w_kn, choice)


def block_mask(logits: jax.Array, gumbel: jax.Array, use_hard: jax.Array, *,
               temperature: float, soft_mask: str,
               choice: jax.Array | None = None) -> tuple[jax.Array, jax.Array]:
  """The training mask `[..., blocks, N]` and the hard choice `[..., blocks]` (int32).

  The hard choice is `argmax(logits + temperature * gumbel)` (Trax), or `choice` when given
  (a reversible network replays the forward pass's choice when it recomputes the layer); the
  soft mask is `softmax(logits)` ("clean", Trax) or `softmax(logits + temperature * gumbel)`
  ("noisy"). `use_hard` (a boolean scalar) picks the straight-through one-hot over the soft
  mask.
  """
  noisy = logits + temperature * gumbel
  soft = jax.nn.softmax(noisy if soft_mask == "noisy" else logits, axis=-1)
  if choice is None:
    choice = first_max_index(noisy)
  hard = jax.nn.one_hot(choice, logits.shape[-1], dtype=soft.dtype)
  return jnp.where(use_hard, straight_through(hard, soft), soft), choice


class SparseFF(FeedForward):
  """FF contract `y, aux = ff(x)`; `decode(x)` is the sparse inference path."""

  has_sparse_decode = True
  SOFT_MASKS, CONTROLLER_INITS, MASK_PLACEMENTS = SOFT_MASKS, CONTROLLER_INITS, MASK_PLACEMENTS

  def __init__(self, d_model: int, d_ff: int, block_size: int, d_lowrank: int, *,
               n_layers: int = 1, temperature: float = 0.1, quant_prob: float = 0.3,
               soft_mask: str = "clean", controller_init: str = "glorot",
               up_bias: bool = False, mask_placement: str = "pre_relu", rngs: nnx.Rngs):
    if d_ff % block_size:
      raise ValueError(f"d_ff={d_ff} must be divisible by block_size={block_size}.")
    validation.require_choice(soft_mask, "soft_mask", SOFT_MASKS)
    validation.require_choice(controller_init, "controller_init", CONTROLLER_INITS)
    validation.require_choice(mask_placement, "mask_placement", MASK_PLACEMENTS)
    self.d_model, self.d_ff, self.block_size, self.d_lowrank = d_model, d_ff, block_size, d_lowrank
    self.temperature, self.quant_prob, self.soft_mask = temperature, quant_prob, soft_mask
    self.mask_placement = mask_placement
    up = jax.nn.initializers.normal(initializers.depth_scaled_std(d_model, n_layers))
    down = jax.nn.initializers.normal(initializers.depth_scaled_std(d_ff, n_layers))
    # W1 is stored transposed, one row per hidden unit, so that decoding gathers whole
    # contiguous rows of both matrices.
    self.w_keys = nnx.Param(up(rngs.params(), (d_ff, d_model)),  # W1^T
                            logical_axes=("mlp", "embed"))
    self.b_up = nnx.Param(jnp.zeros((d_ff,)), logical_axes=("mlp",)) if up_bias else None
    self.w_values = nnx.Param(down(rngs.params(), (d_ff, d_model)),  # W2
                              logical_axes=("mlp", "embed"))
    self.b_down = nnx.Param(jnp.zeros((d_model,)), logical_axes=("embed",))
    c_down, c_up = self._controller_weights(controller_init, rngs)
    self.c_down = nnx.Param(c_down, logical_axes=("embed", "lowrank"))
    self.c_up = nnx.Param(c_up, logical_axes=("lowrank", "mlp"))
    self.c_bias = nnx.Param(jnp.zeros((d_ff,)), logical_axes=("mlp",))
    self.deterministic = False
    self.rngs = rngs["routing"].fork()

  def _controller_weights(self, init: str, rngs: nnx.Rngs) -> tuple[jax.Array, jax.Array]:
    """C1 `[d_model, d_lowrank]`, C2 `[d_lowrank, d_ff]`: Glorot-uniform (limit
    `sqrt(6 / (fan_in + fan_out))`, Trax) or N(0, 1/fan_in)."""
    shapes = ((self.d_model, self.d_lowrank), (self.d_lowrank, self.d_ff))
    if init == "glorot":
      glorot = jax.nn.initializers.glorot_uniform()
      return tuple(glorot(rngs.params(), shape) for shape in shapes)
    return tuple(jax.nn.initializers.normal(shape[0] ** -0.5)(rngs.params(), shape)
                 for shape in shapes)

  def controller_logits(self, x: jax.Array) -> jax.Array:
    """`[..., d_ff / N, N]` block scores `x C1 C2 + c`, in float32 at least."""
    logits = (x @ self.c_down[...].astype(x.dtype)) @ self.c_up[...].astype(x.dtype)
    logits = logits.astype(jnp.promote_types(x.dtype, jnp.float32)) + self.c_bias[...]
    return logits.reshape(*x.shape[:-1], self.d_ff // self.block_size, self.block_size)

  def mask(self, x: jax.Array, gumbel: jax.Array | None = None,
           use_hard: jax.Array | None = None,
           choice: jax.Array | None = None) -> tuple[jax.Array, jax.Array]:
    """`([..., d_ff] mask, [..., d_ff / N] int32 choice)`: one-hot of `argmax(logits)` per
    block in eval; `block_mask` in training.

    The Gumbel noise `[..., d_ff / N, N]` and the hard/soft draw are taken from the layer's
    `routing` stream unless given (tests inject them); `choice`, if given, replaces the
    argmax (replay, see `block_mask`).
    """
    logits = self.controller_logits(x)
    if self.deterministic:
      if choice is None:
        choice = first_max_index(logits)
      hard = jax.nn.one_hot(choice, self.block_size, dtype=jnp.float32)
      return hard.reshape(*x.shape[:-1], self.d_ff), choice
    if gumbel is None or use_hard is None:
      gumbel_key, quant_key = jax.random.split(self.rngs())
      gumbel = jax.random.gumbel(gumbel_key, logits.shape) if gumbel is None else gumbel
      use_hard = jax.random.bernoulli(quant_key, self.quant_prob) if use_hard is None else use_hard
    mask, choice = block_mask(logits, gumbel, use_hard, temperature=self.temperature,
                              soft_mask=self.soft_mask, choice=choice)
    return mask.reshape(*x.shape[:-1], self.d_ff), choice

  def up(self, x: jax.Array) -> jax.Array:
    """`x W1 (+ b1)`, `[..., d_ff]`, before the mask and the ReLU."""
    pre = x @ self.w_keys[...].T.astype(x.dtype)
    return pre if self.b_up is None else pre + self.b_up[...].astype(x.dtype)

  def masked_hidden(self, pre: jax.Array, mask: jax.Array) -> jax.Array:
    """`ReLU(pre * mask)` (Trax) or `ReLU(pre) * mask` (paper), `[..., d_ff]`."""
    mask = mask.astype(pre.dtype)
    if self.mask_placement == "pre_relu":
      return jax.nn.relu(pre * mask)
    return jax.nn.relu(pre) * mask

  def down(self, h: jax.Array) -> jax.Array:
    """`h W2 + b2`, `[..., d_model]`; under sequence parallelism (`layers.sequence_parallel`)
    `W2`'s partial sums over each device's blocks are reduce-scattered onto sequence
    shards."""
    w_values = self.w_values[...].astype(h.dtype)
    if sequence_parallel.active():
      y = sequence_parallel.row_parallel(jnp.matmul, [(h, ("batch", None, "mlp"))],
                                         [(w_values, ("mlp", "embed"))])
    else:
      y = h @ w_values
    return y + self.b_down[...].astype(h.dtype)

  def __call__(self, x: jax.Array, *, gumbel: jax.Array | None = None,
               use_hard: jax.Array | None = None) -> tuple[jax.Array, dict[str, jax.Array]]:
    """`[..., d_model] -> [..., d_model]`, all `d_ff` units computed then masked (training
    and evaluation); `gumbel`, `use_hard` as in `mask`."""
    y, aux, _ = self.replayable(x, gumbel=gumbel, use_hard=use_hard)
    return y, aux

  def replayable(self, x: jax.Array, choice: jax.Array | None = None, *,
                 gumbel: jax.Array | None = None, use_hard: jax.Array | None = None):
    """`(y, aux, choice)`: `__call__` that also returns the hard choice `[..., d_ff / N]`
    and takes it back as `choice`, so that a reversible network recomputing this layer from
    reconstructed inputs picks the same units (`sparse_jax.layers.reversible`). Under
    sequence parallelism `x` arrives on sequence shards: the controller and W1 read it
    whole."""
    if sequence_parallel.active():
      x = parallel.whole_sequences(x)
    mask, choice = self.mask(x, gumbel, use_hard, choice)
    y = self.down(self.masked_hidden(self.up(x), mask))
    return y, {"reg_loss": jnp.zeros((), jnp.float32)}, choice

  def decode(self, x: jax.Array) -> jax.Array:
    """Eval output reading only the chosen unit's W1 column and W2 row in every block.

    The chosen unit's mask value is 1, so both placements give `ReLU(x W1[:, u] (+ b1[u]))`.
    With the hidden units split over `mesh.tensor` (whole blocks per device), each device
    reads its own blocks' chosen rows and one all-reduce adds the partial outputs.
    """
    dtype = x.dtype
    choice = first_max_index(self.controller_logits(x))  # [..., blocks]
    keys_kd = chosen_rows(self.w_keys[...], choice, self.block_size).astype(dtype)
    pre = jnp.einsum("...d,...kd->...k", x, keys_kd)
    if self.b_up is not None:
      pre = pre + chosen_rows(self.b_up[...], choice, self.block_size).astype(dtype)
    values_kd = chosen_rows(self.w_values[...], choice, self.block_size).astype(dtype)
    return jnp.einsum("...k,...kd->...d", jax.nn.relu(pre).astype(dtype),
                      values_kd) + self.b_down[...].astype(dtype)

  def flops_per_token(self) -> int:
    """Decoding multiply-adds: the controller plus one unit per block of each matmul."""
    controller = self.d_model * self.d_lowrank + self.d_lowrank * self.d_ff
    return controller + 2 * self.d_model * (self.d_ff // self.block_size)
