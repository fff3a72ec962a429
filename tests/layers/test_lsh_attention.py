"""Terraformer's LSH self-attention (Sec. 4; Trax 1.4 `LSHSelfAttention`) against naive numpy.

The float64 reference below is written from the description of Trax's algorithm in the
module docstring, one query at a time: per round, sort (bucket, position), pad the round to
a multiple of the chunk length with masked tokens that sort last, concatenate the rounds,
let each chunk see its neighbours cyclically, subtract 1e9 for later / padding keys and 1e5
for the token itself, softmax, then weight the rounds by the softmax of their log-sum-exps.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.test_util import check_grads

from attention_testing import naive_conv
from float64_testing import float64_function, numpy_params
from sparse_jax.layers.counting import count_params
from sparse_jax.layers.lsh_attention import LSHSelfAttention

D, H, B, CHUNK, N_BUCKETS = 16, 2, 2, 4, 4
C = D // H


def make_attention(qkv: str = "dense", *, n_hashes: int = 2, causal: bool = True,
                   n_chunks_after: int = 0, chunk_len: int = CHUNK, attn_dropout: float = 0.0,
                   seed: int = 0) -> LSHSelfAttention:
  """A layer whose sparse-QKV biases (if any) are random, nonzero."""
  attn = LSHSelfAttention(D, H, n_layers=2, n_hashes=n_hashes, n_buckets=N_BUCKETS,
                          chunk_len=chunk_len, n_chunks_before=1, n_chunks_after=n_chunks_after,
                          causal=causal, attn_dropout=attn_dropout, qkv=qkv, rngs=nnx.Rngs(seed))
  if qkv == "sparse":
    proj = attn.projections
    rng = np.random.default_rng(seed + 100)
    for bias in (proj.mult.bias, proj.conv_q.bias, proj.conv_k.bias, proj.conv_v.bias):
      bias[...] = jnp.asarray(rng.normal(size=bias.shape), jnp.float32)
  return attn


def random_x(seed: int, t: int, b: int = B) -> jax.Array:
  return jnp.asarray(np.random.default_rng(seed).normal(size=(b, t, D)), jnp.float32)


def jitted(attn: LSHSelfAttention):
  """`f(x, **kwargs) -> (y, buckets)`: the layer as one jitted function of its state."""
  graphdef, state = nnx.split(attn)

  @jax.jit
  def f(state, x, valid_bt=None, buckets=None, rotations=None):
    return nnx.merge(graphdef, state)(x, valid_bt=valid_bt, buckets=buckets,
                                      rotations=rotations)

  return lambda x, **kwargs: f(state, x, **kwargs)


# ---------------------------------------------------------------- float64 numpy reference


def naive_qk_v(p: dict, x_td: np.ndarray, qkv: str) -> tuple[np.ndarray, np.ndarray]:
  """Shared qk and v `[T, H, C]` of one example."""
  p = p["projections"]
  if qkv == "dense":
    return np.einsum("td,dhc->thc", x_td, p["w_qk"]), np.einsum("td,dhc->thc", x_td, p["w_v"])
  n_s = p["mult"]["d_is"].shape[1]
  y_tsm = np.einsum("ti,is,im->tsm", x_td, p["mult"]["d_is"], p["mult"]["e_im"])
  y_tsm = y_tsm + p["mult"]["bias"].reshape(n_s, -1)
  q, k, v = (naive_conv(y_tsm, p[name]["kernel"], p[name]["bias"]).reshape(len(x_td), H, C)
             for name in ("conv_q", "conv_k", "conv_v"))
  return (q + k) / 2, v


def naive_out(p: dict, o_thc: np.ndarray, qkv: str) -> np.ndarray:
  if qkv == "dense":
    return np.einsum("thc,hcd->td", o_thc, p["projections"]["w_o"])
  return o_thc.reshape(len(o_thc), D)


def naive_key(qk_c: np.ndarray) -> np.ndarray:
  return qk_c / np.sqrt(np.mean(qk_c ** 2) + 1e-6) / np.sqrt(len(qk_c))


def logsumexp(a: np.ndarray, axis=None) -> np.ndarray:
  m = np.max(a, axis=axis, keepdims=True)
  return np.squeeze(m + np.log(np.sum(np.exp(a - m), axis=axis, keepdims=True)), axis=axis)


def naive_lsh_head(qk_tc, v_tc, buckets_nt, valid_t, *, chunk_len, causal, before, after):
  """One example and head, `[T, C]`: the sorted concatenation of the rounds, the chunk
  windows, masks, per-query softmax and log-sum-exp, then the rounds' combination."""
  n_t, n_c = qk_tc.shape
  n_rounds = len(buckets_nt)
  padded = -(-n_t // chunk_len) * chunk_len
  qk = np.concatenate([qk_tc, np.zeros((padded - n_t, n_c))])
  v = np.concatenate([v_tc, np.zeros((padded - n_t, n_c))])
  valid = np.concatenate([valid_t, np.zeros(padded - n_t, bool)])
  keys = np.array([naive_key(row) if np.any(row) else row for row in qk])
  order = []  # (round, position) of every sorted slot
  for r in range(n_rounds):

    def sort_key(u, r=r):  # bucket then position; the length padding last
      return (0, buckets_nt[r, u], u) if u < n_t else (1, 0, u)

    order += [(r, u) for u in sorted(range(padded), key=sort_key)]
  n_chunks = len(order) // chunk_len
  o = np.zeros((n_rounds, padded, n_c))
  lse = np.zeros((n_rounds, padded))
  for i, (r, t) in enumerate(order):
    window = [order[((i // chunk_len + j) % n_chunks) * chunk_len + m][1]
              for j in range(-before, after + 1) for m in range(chunk_len)]
    scores = np.array([qk[t] @ keys[u] - 1e9 * (causal and u > t) - 1e5 * (u == t)
                       - 1e9 * (not valid[u]) for u in window])
    lse[r, t] = logsumexp(scores)
    o[r, t] = np.exp(scores - lse[r, t]) @ v[window]
  weights = np.exp(lse - logsumexp(lse, axis=0))
  return np.sum(weights[..., None] * o, axis=0)[:n_t]


def naive_layer(attn: LSHSelfAttention, qkv: str, x_btd, buckets_bhnt, valid_bt) -> np.ndarray:
  p = numpy_params(attn)
  out = []
  for b in range(len(x_btd)):
    qk_thc, v_thc = naive_qk_v(p, np.asarray(x_btd[b], np.float64), qkv)
    o_thc = np.stack([naive_lsh_head(
        qk_thc[:, h], v_thc[:, h], np.asarray(buckets_bhnt[b, h]), np.asarray(valid_bt[b]),
        chunk_len=attn.chunk_len, causal=attn.causal, before=attn.n_chunks_before,
        after=attn.n_chunks_after) for h in range(H)], axis=1)
    out.append(naive_out(p, o_thc, qkv))
  return np.stack(out)


def random_buckets(seed: int, n_hashes: int, valid_bt) -> jax.Array:
  """Uniform buckets with the layer's round offsets; padding in the padding bucket."""
  t = valid_bt.shape[1]
  raw = np.random.default_rng(seed).integers(0, N_BUCKETS, size=(B, H, n_hashes, t))
  raw = np.where(np.asarray(valid_bt)[:, None, None], raw, N_BUCKETS)
  return jnp.asarray(raw + np.arange(n_hashes)[:, None] * (N_BUCKETS + 1), jnp.int32)


def padding(t: int, n_valid: tuple[int, ...]) -> jax.Array:
  return jnp.arange(t)[None, :] < jnp.asarray(n_valid)[:, None]


# (qkv, n_hashes, causal, n_chunks_after, T, valid lengths or None, random buckets?)
CASES = {
    "causal_dense": ("dense", 2, True, 0, 16, None, False),
    "causal_dense_t14_3hashes": ("dense", 3, True, 0, 14, None, False),
    "encoder_padded": ("dense", 2, False, 1, 16, (16, 11), False),
    "encoder_padded_random_buckets": ("dense", 3, False, 1, 13, (9, 13), True),
    "decoder_padded": ("dense", 2, True, 0, 12, (12, 7), True),
    "causal_sparse": ("sparse", 2, True, 0, 16, None, False),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_matches_naive_float64(case):
  """float32 layer vs float64 reference given the same buckets. Scores are O(1) (|k| = 1,
  |q| ~ 3) and pass through one softmax and one round softmax, so float32 rounding stays
  near 1e-6 (rtol 1e-4, atol 1e-5 as the other attention tests). Scores carrying the 1e5
  self penalty are held only to ~8e-3 in float32, but they matter only when a query sees
  nothing but itself (position 0, causally), and then every copy of its own key has the
  same score and the output is exactly its value."""
  qkv, n_hashes, causal, after, t, n_valid, given = CASES[case]
  attn = make_attention(qkv, n_hashes=n_hashes, causal=causal, n_chunks_after=after)
  x = random_x(1, t)
  valid = jnp.ones((B, t), bool) if n_valid is None else padding(t, n_valid)
  buckets = random_buckets(2, n_hashes, valid) if given else None
  y, buckets = jitted(attn)(x, valid_bt=valid, buckets=buckets)
  want = naive_layer(attn, qkv, x, buckets, valid)
  rows = np.asarray(valid)  # padded queries' outputs are unused
  np.testing.assert_allclose(np.asarray(y)[rows], want[rows], rtol=1e-4, atol=1e-5)


# ---------------------------------------------------------------- replay and one window


def test_replayed_buckets_reproduce_the_output_bit_for_bit():
  """Training mode with attention dropout: the same dropout RNG and the returned buckets
  give exactly the same output without hashing (what a reversible network relies on)."""
  attn = make_attention(attn_dropout=0.3, n_hashes=3)
  graphdef, state = nnx.split(attn)
  x = random_x(3, 16)

  @jax.jit
  def run(state, x, buckets=None):
    model = nnx.merge(graphdef, state)
    y, buckets = model(x, buckets=buckets)
    return y, buckets, nnx.state(model)

  y, buckets, moved = run(state, x)
  y_replayed, buckets_replayed, _ = run(state, x, buckets)
  np.testing.assert_array_equal(y_replayed, y)
  np.testing.assert_array_equal(buckets_replayed, buckets)
  y_other_dropout, _, _ = run(moved, x, buckets)  # the dropout stream has moved on
  assert np.abs(np.asarray(y_other_dropout) - np.asarray(y)).max() > 1e-3


def naive_full_attention(attn, x_btd, valid_bt) -> np.ndarray:
  """Plain attention with shared QK (normalised keys), causal or not, and Trax's masks."""
  p = numpy_params(attn)
  out = []
  for b in range(len(x_btd)):
    qk, v = naive_qk_v(p, np.asarray(x_btd[b], np.float64), "dense")
    n_t = len(qk)
    o = np.zeros_like(qk)
    for h in range(H):
      for i in range(n_t):
        scores = np.array([qk[i, h] @ naive_key(qk[j, h]) - 1e5 * (j == i)
                           - 1e9 * (attn.causal and j > i) - 1e9 * (not valid_bt[b, j])
                           for j in range(n_t)])
        w = np.exp(scores - scores.max())
        o[i, h] = w @ v[:, h] / w.sum()
    out.append(naive_out(p, o, "dense"))
  return np.stack(out)


@pytest.mark.parametrize("causal,t,n_valid", [(True, 8, None), (False, 6, (6, 4))])
def test_one_chunk_window_is_plain_attention_with_the_self_mask(causal, t, n_valid):
  """T <= chunk_len: every round's window holds all tokens (each round twice, cyclically),
  so whatever the buckets, LSH attention is ordinary shared-QK attention."""
  attn = make_attention(causal=causal, n_chunks_after=0 if causal else 1, chunk_len=8)
  x = random_x(4, t)
  valid = jnp.ones((B, t), bool) if n_valid is None else padding(t, n_valid)
  y, _ = jitted(attn)(x, valid_bt=valid)
  rows = np.asarray(valid)
  np.testing.assert_allclose(np.asarray(y)[rows],
                             naive_full_attention(attn, x, np.asarray(valid))[rows],
                             rtol=1e-4, atol=1e-5)


# ---------------------------------------------------------------- hashing


def test_buckets_are_argmax_over_plus_minus_rotations_with_round_offsets():
  n_hashes, t = 3, 12
  attn = make_attention(n_hashes=n_hashes)
  x = random_x(5, t)
  valid = padding(t, (12, 9))
  rotations = attn.draw_rotations(B)
  assert rotations.shape == (B, H, C, n_hashes, N_BUCKETS // 2)
  f = jitted(attn)
  _, buckets = f(x, valid_bt=valid, rotations=rotations)
  assert buckets.shape == (B, H, n_hashes, t) and buckets.dtype == jnp.int32
  rot = np.asarray(rotations, np.float64)
  for b in range(B):
    qk, _ = naive_qk_v(numpy_params(attn), np.asarray(x[b], np.float64), "dense")
    for h in range(H):
      for r in range(n_hashes):
        offset = r * (N_BUCKETS + 1)
        got = np.asarray(buckets[b, h, r])
        rotated = qk[:, h] @ rot[b, h, :, r]
        want = np.argmax(np.concatenate([rotated, -rotated], axis=-1), axis=-1)
        want = np.where(np.asarray(valid[b]), want, N_BUCKETS)
        np.testing.assert_array_equal(got - offset, want)
        assert np.all((got >= offset) & (got <= offset + N_BUCKETS))
  _, same = f(x, valid_bt=valid, rotations=rotations)
  np.testing.assert_array_equal(same, buckets)
  hash_only = nnx.jit(lambda layer, x: layer(x, valid_bt=valid)[1])
  first, second = hash_only(attn, x), hash_only(attn, x)  # rotations drawn per call
  assert np.any(np.asarray(first) != np.asarray(second))


# ---------------------------------------------------------------- decoding


def test_internal_length_padding_equals_padding_keys():
  """A prefix of length L (not a multiple of the chunk) equals the sequence cut at the next
  multiple with the tokens after L marked as padding: both put the extra tokens in the
  padding bucket as masked keys. The decoding test below relies on it."""
  attn = make_attention()
  attn.eval()
  rotations = attn.draw_rotations(B)
  x = random_x(6, 16)
  f = jitted(attn)
  y_prefix, _ = f(x[:, :14], rotations=rotations)
  y_padded, _ = f(x, valid_bt=padding(16, (14, 14)), rotations=rotations)
  np.testing.assert_allclose(y_padded[:, :14], y_prefix, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("qkv", ["dense", "sparse"])
def test_decode_token_by_token_equals_full_forward_on_each_prefix(qkv):
  """Positions 0..19 with chunk 4: the decoded output at t equals the full forward (same
  rotations, eval mode) on the prefix `x[:, :t + 1]` at t. The prefix is run as the
  sequence up to the next multiple of the chunk with later tokens as padding (equal, see
  the test above), so there are 5 shapes to compile instead of 20."""
  t_len, max_len = 20, 23
  attn = make_attention(qkv, attn_dropout=0.5, seed=7)
  attn.eval()
  x = random_x(8, t_len)
  rotations = attn.draw_rotations(B)
  graphdef, state = nnx.split(attn)

  @jax.jit
  def step(state, x_b1d, cache, position):
    return nnx.merge(graphdef, state).decode(x_b1d, cache, position)

  f = jitted(attn)
  cache = attn.init_cache(B, max_len, jnp.float32, rotations=rotations)
  for t in range(t_len):
    y_b1d, cache = step(state, x[:, t:t + 1], cache, jnp.int32(t))
    end = -(-(t + 1) // CHUNK) * CHUNK
    y_prefix, _ = f(x[:, :end], valid_bt=padding(end, (t + 1,) * B), rotations=rotations)
    np.testing.assert_allclose(y_b1d[:, 0], y_prefix[:, t], rtol=1e-5, atol=1e-5,
                               err_msg=f"position {t}")
  assert int(cache["counts"].sum()) == B * H * 2 * t_len


def test_replayed_buckets_must_have_the_layer_shape():
  attn = make_attention(n_hashes=2)
  with pytest.raises(ValueError, match="buckets"):
    attn(random_x(0, 8), buckets=jnp.zeros((B, H, 3, 8), jnp.int32))


def test_cache_layout():
  attn = make_attention("sparse", n_hashes=3)
  cache = attn.init_cache(B, 10, jnp.bfloat16)
  shapes = {name: (a.shape, a.dtype) for name, a in cache.items()}
  assert shapes == {
      "k": ((B, H, 10, C), jnp.bfloat16), "v": ((B, H, 10, C), jnp.bfloat16),
      "buckets": ((B, H, 3, 10), jnp.int32), "index": ((B, H, 3, 10), jnp.int32),
      "counts": ((B, H, 3, N_BUCKETS), jnp.int32),
      "rotations": ((B, H, C, 3, N_BUCKETS // 2), jnp.float32),
      "mult": ((B, 2, H, C), jnp.bfloat16)}


# ---------------------------------------------------------------- gradients, counts, errors


@pytest.mark.parametrize("qkv,causal", [("dense", False), ("sparse", True)])
def test_gradients_match_finite_differences_in_float64(qkv, causal):
  """Buckets fixed (the replay): the layer is smooth in x and the parameters."""
  attn = make_attention(qkv, causal=causal, n_chunks_after=0 if causal else 1)
  x = random_x(9, 8, b=1)
  valid = padding(8, (7,))
  _, buckets = jitted(attn)(x, valid_bt=valid)
  with jax.enable_x64(True):
    f, params = float64_function(
        attn, lambda layer, x: layer(x, valid_bt=valid, buckets=buckets)[0])
    x64 = jnp.asarray(x, jnp.float64)
    assert f(params, x64).dtype == jnp.float64
    check_grads(jax.jit(f), (params, x64), order=1, modes=("rev",), eps=1e-6)


def test_parameter_count_and_flops_closed_forms():
  dense = make_attention()
  assert count_params(dense) == dense.flops_per_token() == 3 * D * D
  sparse = make_attention("sparse")
  s, m, taps = H, C, 3 * 3 + 3 * 3 + 3 * 1
  assert count_params(sparse) == D * (s + m) + D + taps * m * m + 3 * m
  assert sparse.flops_per_token() == D * (s + D) + s * taps * m * m


@pytest.mark.parametrize("kwargs,field", [
    ({"n_buckets": 5}, "n_buckets"), ({"n_buckets": 0}, "n_buckets"),
    ({"n_hashes": 0}, "n_hashes"), ({"chunk_len": 0}, "chunk_len"),
    ({"n_chunks_before": -1}, "n_chunks_before"), ({"n_chunks_after": -1}, "n_chunks_after"),
    ({"qkv": "conv"}, "qkv"), ({"qkv": "sparse", "causal": False}, "qkv"),
    ({"n_modules": 4}, "n_modules"), ({"qkv": "sparse", "n_modules": 3}, "n_modules"),
    ({"attn_dropout": 1.0}, "attn_dropout"), ({"n_heads": 3}, "n_heads")])
def test_bad_arguments_raise_naming_the_field(kwargs, field):
  kwargs = {"n_layers": 1, "n_buckets": N_BUCKETS, "chunk_len": CHUNK, "n_heads": H} | kwargs
  with pytest.raises(ValueError, match=field):
    LSHSelfAttention(D, rngs=nnx.Rngs(0), **kwargs)


def test_decoding_needs_causal():
  with pytest.raises(ValueError, match="causal"):
    make_attention(causal=False).init_cache(B, 8, jnp.float32)
