"""Terraformer's Trax options (`models.terraformer_blocks`): Trax 1.4's dropout placement and
mask shapes (`model.shared_dropout`, `model.ff_dropout`) and the decoder's dense attention
biases (`model.attention_bias`).

A dropped element is an exact zero of the half-residual's output (`nnx.Dropout` selects 0),
so the zeros of an output in training mode at rate 0.5 are its dropout pattern; it is
compared with the axes along which Trax's `Dropout(shared_axes)` mask is constant, written
out below from Trax's code.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import terraformer_testing
from sparse_jax.configs import terraformer_arithmetic
from sparse_jax.models.rngs import make_rngs
from sparse_jax.models.terraformer import Terraformer
from sparse_jax.models.terraformer_blocks import AttentionHalf, FeedForwardHalf
from sparse_jax.models.terraformer_config import TerraformerConfig
from sparse_jax.validation import ConfigError

B, T, D = 3, 8, 32
DENSE_FF = {"kind": "dense", "d_ff": 64}


def raw_config(**overrides):
  """A 1+1-layer d_model 32 Terraformer at dropout 0.5 (LSH chunks of 4, sparse FF, SRU)."""
  cfg = terraformer_arithmetic.model_config(transformer=False)
  cfg.update(d_model=D, n_heads=2, n_encoder_layers=1, n_decoder_layers=1, dropout=0.5)
  cfg.ff.d_ff = 64
  cfg.lsh.update(chunk_len=4, n_buckets=4)
  for field, value in overrides.items():
    cfg[field] = value
  return cfg


def config(**overrides) -> TerraformerConfig:
  return TerraformerConfig.parse(raw_config(**overrides), "model")


# Trax 1.4, written out: `core.Dropout.forward` draws a mask of the input's shape with every
# axis in `shared_axes` set to 1; `combinators.BatchLeadingAxes` (around `SparseFF`) first
# flattens `[..., d]` to `[-1, d]`; `efficient_attention.apply_broadcasted_dropout` (LSH
# attention's output) draws a `[d]` mask.
def trax_shared_axes(shape, shared_axes, batch_leading_axes=False) -> set[int]:
  """The axes of `shape` along which Trax's dropout mask is constant."""
  if batch_leading_axes:
    flat = trax_shared_axes((int(np.prod(shape[:-1])), shape[-1]), shared_axes)
    return set(range(len(shape) - 1)) if 0 in flat else set()
  mask_shape = list(shape)
  for axis in shared_axes:
    mask_shape[axis] = 1
  return {a for a, n in enumerate(mask_shape) if n == 1}


def trax_broadcasted_shared_axes(shape) -> set[int]:
  return set(range(len(shape) - 1))


def constant_axes(dropped: np.ndarray) -> set[int]:
  """The axes along which the boolean pattern does not change."""
  return {a for a in range(dropped.ndim)
          if np.array_equal(dropped, np.broadcast_to(np.take(dropped, [0], axis=a),
                                                     dropped.shape))}


def random_x(seed: int = 0) -> jax.Array:
  return jnp.asarray(np.random.default_rng(seed).normal(size=(B, T, D)), jnp.float32)


def train_output(half, x) -> np.ndarray:
  half.train()
  return np.asarray(half(x, jnp.ones(x.shape[:2], bool))[0])


def attention_half(causal: bool = False, **overrides) -> AttentionHalf:
  return AttentionHalf(config(**overrides), causal=causal, n_layers=2, rngs=make_rngs(0))


def ff_half(**overrides) -> FeedForwardHalf:
  return FeedForwardHalf(config(sru_units=0, **overrides), n_layers=2, rngs=make_rngs(0))


SITES = {  # name: (half built with the options, Trax's shared axes of its [B, T, D] output)
    "lsh_attention_output": (lambda **o: attention_half(encoder_attention="lsh", **o),
                             trax_broadcasted_shared_axes((B, T, D))),
    "dense_ff_output": (lambda **o: ff_half(ff=DENSE_FF, **o),
                        trax_shared_axes((B, T, D), [-2])),
    "sparse_ff_output": (lambda **o: ff_half(**o),
                         trax_shared_axes((B, T, D), [-2], batch_leading_axes=True)),
}


@pytest.mark.parametrize("site", sorted(SITES))
def test_shared_masks_are_constant_exactly_along_trax_shared_axes(site):
  build, want = SITES[site]
  dropped = train_output(build(), random_x()) == 0
  assert constant_axes(dropped) == want
  assert 0.2 < dropped.mean() < 0.8  # Rate 0.5, and the other axes do vary.


@pytest.mark.parametrize("site", sorted(SITES))
def test_without_shared_dropout_every_element_is_dropped_independently(site):
  build, _ = SITES[site]
  dropped = train_output(build(shared_dropout=False), random_x()) == 0
  assert constant_axes(dropped) == set()
  assert 0.4 < dropped.mean() < 0.6


@pytest.mark.parametrize("ff_dropout,rate", [(None, 0.5), (0.25, 0.25)])
def test_dense_ff_hidden_mask_is_shared_along_the_length(ff_dropout, rate):
  """Trax's `_FeedForward`: `Dropout(ff_dropout or dropout, shared_axes=[-2])` on the hidden
  units. A positive pre-activation is dropped iff its hidden unit is zero."""
  half = ff_half(ff=DENSE_FF, ff_dropout=ff_dropout)
  assert half.ff.dropout.rate == rate
  half.train()
  h = half.norm(random_x())
  pre = np.asarray(h @ half.ff.w_up[...] + half.ff.b_up[...])
  hidden = np.asarray(half.ff.up(h))
  positive, dropped = pre > 0, (hidden == 0)
  np.testing.assert_allclose(hidden[positive & ~dropped], pre[positive & ~dropped] / (1 - rate),
                             rtol=1e-5)
  # One decision per (row, unit): the same at every position where the unit is positive.
  per_row_unit = np.full((B, 64), -1)
  for b, t, f in zip(*np.nonzero(positive)):
    assert per_row_unit[b, f] in (-1, dropped[b, t, f])
    per_row_unit[b, f] = dropped[b, t, f]
  assert len({tuple(row) for row in per_row_unit}) == B  # Rows draw their own masks.
  assert abs((per_row_unit == 1).sum() / (per_row_unit >= 0).sum() - rate) < 0.15


@pytest.mark.parametrize("overrides", [
    {"encoder_attention": "dense"},
    {"causal": True, "decoder_attention": "dense"},
    {"causal": True, "decoder_attention": "dense", "decoder_qkv": "sparse"},
    {"causal": True, "decoder_attention": "lsh", "decoder_qkv": "sparse"},
], ids=["bidirectional", "causal", "sparse_qkv", "lsh_sparse_qkv"])
def test_attention_with_projection_layers_has_no_output_dropout(overrides):
  """Trax's `tl.Attention`, `tl.CausalAttention`, `MultiplicativeConvCausalAttention` and
  `PureLSHSelfAttentionWrapper` end at their projections: no output dropout."""
  half = attention_half(**overrides)
  assert half.dropout.rate == 0.0
  x = random_x()
  y = train_output(half, x)
  assert not np.any(y == 0)
  if overrides.get("decoder_attention") != "lsh":  # (LSH draws new rotations per call.)
    half.eval()  # Nothing else random: training and evaluation agree.
    np.testing.assert_array_equal(y, half(x, jnp.ones((B, T), bool))[0])
  old = attention_half(shared_dropout=False, **overrides)
  assert old.dropout.rate == 0.5 and old.dropout.broadcast_dims == ()


def test_decoder_dense_attention_biases_follow_attention_bias():
  with_bias = attention_half(causal=True, decoder_attention="dense").attn
  without = attention_half(causal=True, decoder_attention="dense", attention_bias=False).attn
  assert with_bias.b_q.shape == (2, D // 2) and with_bias.b_o.shape == (D,)
  assert without.b_q is None and without.b_o is None
  for bias in (True, False):  # The encoder's attention (BERT's layer) keeps its biases.
    encoder = attention_half(encoder_attention="dense", attention_bias=bias).attn
    assert encoder.query.bias is not None and encoder.out.bias is not None


@pytest.mark.parametrize("overrides,field", [
    ({"ff": {**DENSE_FF, "dropout": 0.1}}, "model.ff.dropout"),
    ({"ff": DENSE_FF, "shared_dropout": False, "ff_dropout": 0.1}, "model.ff_dropout"),
])
def test_conflicting_hidden_dropout_rates_name_the_field(overrides, field):
  with pytest.raises(ConfigError, match=field):
    ff_half(**overrides)


def loss_and_grads(reversible: bool):
  """Dense attention (the decoder's biased) and dense FF: the FF's hidden and output masks
  shared along the length. (LSH's and the sparse FF's one mask per call: the default config
  of `test_terraformer.py`'s reversible test.)"""
  model = Terraformer(raw_config(reversible=reversible, attn_dropout=0.2, ff_dropout=0.3,
                                 encoder_attention="dense", decoder_attention="dense",
                                 n_decoder_attention_layers=1, sru_units=0, ff=DENSE_FF),
                      rngs=make_rngs(0))
  rng = np.random.default_rng(0)
  inputs = jnp.asarray(rng.integers(2, 12, size=(3, 9)))
  targets = jnp.asarray(rng.integers(2, 12, size=(3, 7)))
  return terraformer_testing.loss_and_grads(model, inputs, targets)


def test_reversible_gradients_with_shared_masks_equal_the_stored_activation_ones():
  """The backward pass recomputes each half with its key, so it redraws the same shared
  masks: reversible and plain autodiff agree at dropout 0.5."""
  loss_rev, grads_rev = loss_and_grads(True)
  loss_seq, grads_seq = loss_and_grads(False)
  np.testing.assert_allclose(loss_rev, loss_seq, rtol=1e-6)
  flat_rev = jax.tree_util.tree_leaves_with_path(grads_rev)
  flat_seq = jax.tree.leaves(grads_seq)
  assert len(flat_rev) == len(flat_seq)
  for (path, got), want in zip(flat_rev, flat_seq):
    if jax.tree_util.keystr(path).endswith("['b_k']"):
      # The key bias shifts all of a query's scores alike: its gradient is zero (rounding).
      assert max(np.abs(got).max(), np.abs(want).max()) < 1e-6
      continue
    scale = np.abs(want).max() + 1e-6
    np.testing.assert_allclose(got / scale, want / scale, atol=2e-4, err_msg=str(path))
  assert np.abs(grads_seq["decoder"][0]["attn"]["b_q"]).max() > 1e-3  # Biases train.
