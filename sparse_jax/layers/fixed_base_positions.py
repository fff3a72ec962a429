"""Fixed-base positional encoding of Terraformer (Scaling Transformers; Trax 1.4
`FixedBasePositionalEncoding`, `trax/layers/research/position_encodings.py`).

Terraformer's default `pos_type='fixed-base'` (the arXiv summarisation and copy/add configs)
writes each integer position in several bases and embeds every digit. Its aim is to
generalise to sequences longer than those seen in training (paper Table 4): training starts
half of the sequences at a random position anywhere in a huge range, so every digit value at
every place is seen, and a learned start marker tells the model where a sequence begins.

Encoding of position p, `d_model = n_digits * d_digit`:

    digit_i^b(p) = (p // b^i) mod b                           i = 0 .. n_digits - 1
    E_b(p)       = concat_i( digit_i^b(p) * s[b][i] )          s[b][i] learned, [d_digit]
    E(p)         = sum over bases b of E_b(p)                  [d_model]

with bases (11, 13, 14, 15) and 8 digits by default; the digit is a float32 multiplier, not
a lookup index. A learned `start_vec` [d_model] is added at the first position of the
sequence fed. The largest usable position is `max_pos = min(bases) ** n_digits` (11^8 =
214,358,881); every input length must be below it.

Training (`deterministic=False`): per example, with probability `1 / start_from_zero_one_in`
(1/2) the positions are `0 .. T-1`, otherwise `s .. s+T-1` with s uniform in
`[0, max_pos - T)`; and, independently, with probability `1 / base_dropout_one_in` (1/100)
the whole position embedding of the example is zeroed. `start_vec` is added at the first
token of every example, whatever its start and even when its embedding is dropped.
Evaluation (`deterministic=True`, `model.eval()`): positions `0 .. T-1`, nothing dropped.
Decoding: the caller supplies the positions (`decode(x, position)` or `embed`), as Trax's
`predict` mode does with its position counter.

Trax details reproduced on purpose:
- All bases start with identical weights: Trax splits one key into `n_digits` keys and reuses
  that same list for every base, so `s[b][i]` is the same draw for every `b` at init
  (U(-1e-4, 1e-4), as `start_vec`). They diverge in training only because each base's
  digits differ.
- Base dropout draws ONE per-example mask (from one key) and applies it to every base, so
  all bases are dropped together: the whole position embedding goes, not one base's share.
- Trax's comment says "In 1% of training cases still start from 0"; the code starts from 0
  with probability `1 / start_from_zero_one_in` = 1/2 by default, which is what we do.
- In decoding (`predict`) Trax adds `start_vec` only when its position counter is 0, to the
  first token of the chunk; `decode` does the same (`start_vec` where the position is 0).
  Trax's counter is one scalar for the batch; `decode` also takes one start per row.
- Trax gives the encoder and the decoder separate positional encoders (two instances), and
  applies it after the token embedding and its dropout: Embedding -> Dropout -> this layer.
  Its encoder runs in 'eval' mode when the model decodes.
Not reproduced: Trax's exact random streams (ours come from the `dropout` stream, like the
other stochastic layers, so `model.eval()` / `model.train()` and per-step reseeding apply),
and Trax returns float32 whatever the input dtype; `__call__` returns the input's dtype
(the sum is formed in float32 at least).
Trax does not check positions fed in decoding against `max_pos`; neither do we (beyond it a
base's top digit wraps around).
"""

from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

INT32_MAX = 2**31 - 1


class FixedBasePositions(nnx.Module):
  """Adds Terraformer's fixed-base position encoding to `[B, T, d_model]` inputs (module
  docstring).

  Parameters: `digit_weights`, a list with one `[d_model]` vector per base (in `bases`
  order), the concatenation over digits i of `s[b][i]` (`d_model // n_digits` each; see
  `weights_knd`), and `start_vec [d_model]`; all U(-init_limit, init_limit), every base the
  same draw (as Trax). Randomness (training starts and base dropout) comes from a fork of
  the `dropout` stream; `deterministic` (set by `model.eval()` / `model.train()`) turns it off.
  """

  def __init__(self, d_model: int, *, bases: Sequence[int] = (11, 13, 14, 15),
               n_digits: int = 8, start_from_zero_one_in: int = 2,
               base_dropout_one_in: int = 100, init_limit: float = 1e-4,
               deterministic: bool = False, rngs: nnx.Rngs):
    bases = tuple(int(b) for b in bases)
    if d_model % n_digits != 0:
      raise ValueError(f"FixedBasePositions: d_model ({d_model}) must be divisible by "
                       f"n_digits ({n_digits}); d_model % n_digits = {d_model % n_digits}.")
    if not bases or min(bases) < 2 or n_digits < 1:
      raise ValueError(f"FixedBasePositions needs bases >= 2 and n_digits >= 1; got "
                       f"bases={bases}, n_digits={n_digits}.")
    if start_from_zero_one_in < 1 or base_dropout_one_in < 1:
      raise ValueError(f"start_from_zero_one_in ({start_from_zero_one_in}) and "
                       f"base_dropout_one_in ({base_dropout_one_in}) must be >= 1.")
    self.max_pos = min(bases) ** n_digits
    if self.max_pos > INT32_MAX:
      raise ValueError(f"min(bases) ** n_digits = {self.max_pos} does not fit in int32 "
                       f"positions (bases={bases}, n_digits={n_digits}).")
    self.d_model, self.bases, self.n_digits = d_model, bases, n_digits
    self.start_from_zero_one_in = start_from_zero_one_in
    self.base_dropout_one_in = base_dropout_one_in
    d_digit = d_model // n_digits
    digit_key, start_key = jax.random.split(rngs.params())
    per_digit = jax.random.uniform(digit_key, (n_digits, d_digit), jnp.float32,
                                   -init_limit, init_limit)
    # One [d_model] vector per base: digit i's s[b][i] in slice i (Trax concatenates the
    # digits in this order). Separate 1-D params keep every axis a model-width axis.
    self.digit_weights = nnx.List([
        nnx.Param(per_digit.reshape(d_model).copy(), logical_axes=("embed",))
        for _ in bases])
    self.start_vec = nnx.Param(
        jax.random.uniform(start_key, (d_model,), jnp.float32, -init_limit, init_limit),
        logical_axes=("embed",))
    self.deterministic = deterministic
    self.rngs = rngs["dropout"].fork()

  def digits(self, positions: jax.Array) -> jax.Array:
    """`[..., n_bases, n_digits]` int32: digit i of each position in base b,
    `(p // b^i) mod b` (0 where b^i exceeds int32, as repeated division would give)."""
    positions = jnp.asarray(positions, jnp.int32)[..., None, None]
    powers = np.array([[b**i if b**i <= INT32_MAX else 0 for i in range(self.n_digits)]
                       for b in self.bases], np.int32)
    bases = np.array(self.bases, np.int32)[:, None]
    digits = (positions // np.maximum(powers, 1)) % bases
    return jnp.where(powers > 0, digits, 0)

  def weights_knd(self) -> jax.Array:
    """The digit vectors as one array `[n_bases, n_digits, d_model // n_digits]`:
    `[k, i]` is `s[bases[k]][i]`."""
    return jnp.stack([w[...] for w in self.digit_weights]).reshape(
        len(self.bases), self.n_digits, self.d_model // self.n_digits)

  def embed(self, positions_bt: jax.Array, first_bt: jax.Array | None = None,
            keep_b: jax.Array | None = None) -> jax.Array:
    """The encoding `[..., T, d_model]` (float32, or the params' dtype) of integer positions
    `[..., T]`.

    `first_bt` (bool, broadcastable to the positions): where `start_vec` is added; None means
    where the position is 0 (Trax's decoding rule). `keep_b` (`[...]`, bool or 0/1): rows
    whose position embedding is kept; a dropped row still gets `start_vec`.
    """
    positions_bt = jnp.asarray(positions_bt, jnp.int32)
    weights = self.weights_knd()
    digits = self.digits(positions_bt).astype(weights.dtype)
    enc_btnd = jnp.einsum("...kn,knd->...nd", digits, weights,
                          precision=jax.lax.Precision.HIGHEST)
    enc_btd = enc_btnd.reshape(*positions_bt.shape, self.d_model)
    if keep_b is not None:
      enc_btd = enc_btd * jnp.asarray(keep_b, enc_btd.dtype)[..., None, None]
    if first_bt is None:
      first_bt = positions_bt == 0
    first_bt = jnp.broadcast_to(first_bt, positions_bt.shape)
    return enc_btd + jnp.where(first_bt[..., None], self.start_vec[...], 0.0)

  def draw_starts(self, batch: int, length: int) -> tuple[jax.Array, jax.Array]:
    """`(start [batch] int32, keep [batch] bool)`: each row's first position and whether its
    position embedding is kept. Training: drawn as in the module docstring; deterministic:
    zeros and all kept."""
    self.check_length(length)
    if self.deterministic:
      return jnp.zeros((batch,), jnp.int32), jnp.ones((batch,), bool)
    zero_key, start_key, drop_key = jax.random.split(self.rngs(), 3)
    nonzero = jax.random.randint(zero_key, (batch,), 0, self.start_from_zero_one_in) != 0
    start = jax.random.randint(start_key, (batch,), 0, self.max_pos - length, jnp.int32)
    keep = jax.random.randint(drop_key, (batch,), 0, self.base_dropout_one_in) != 0
    return jnp.where(nonzero, start, 0), keep

  def check_length(self, length: int) -> None:
    if length >= self.max_pos:
      raise ValueError(f"FixedBasePositions: length {length} must be below max_pos = "
                       f"min(bases) ** n_digits = {self.max_pos}.")

  def _add(self, x_btd: jax.Array, enc_btd: jax.Array) -> jax.Array:
    dtype = jnp.promote_types(x_btd.dtype, enc_btd.dtype)
    return (x_btd.astype(dtype) + enc_btd.astype(dtype)).astype(x_btd.dtype)

  def _check_input(self, x_btd: jax.Array) -> None:
    if x_btd.ndim != 3 or x_btd.shape[-1] != self.d_model:
      raise ValueError(f"FixedBasePositions expects x [batch, length, {self.d_model}]; got "
                       f"shape {x_btd.shape}.")

  def __call__(self, x_btd: jax.Array) -> jax.Array:
    """`x + encoding`, `[B, T, d_model]`, in x's dtype: training draws each row's start and
    base dropout (`draw_starts`); deterministic starts every row at 0. `start_vec` is added at
    t = 0 of every row."""
    self._check_input(x_btd)
    batch, length = x_btd.shape[:2]
    start_b, keep_b = self.draw_starts(batch, length)
    positions_bt = start_b[:, None] + jnp.arange(length, dtype=jnp.int32)
    first_bt = jnp.arange(length) == 0
    return self._add(x_btd, self.embed(positions_bt, first_bt, keep_b))

  def decode(self, x_btd: jax.Array, position) -> jax.Array:
    """`x + encoding` for tokens at positions `position + (0 .. T-1)` (an int or int array,
    scalar or `[B]`), in x's dtype; no random start, no dropout, `start_vec` where the
    position is 0 (Trax `predict` mode). The caller advances `position` by T afterwards."""
    self._check_input(x_btd)
    batch, length = x_btd.shape[:2]
    self.check_length(length)
    start = jnp.broadcast_to(jnp.asarray(position, jnp.int32), (batch,))
    positions_bt = start[:, None] + jnp.arange(length, dtype=jnp.int32)
    return self._add(x_btd, self.embed(positions_bt))
