"""Standard causal self-attention and rotary positions against naive float64 numpy."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from attention_testing import decode_all, naive_rotary
from sparse_jax.layers.causal_attention import (CausalSelfAttention, attend, attend_one,
                                                index_after)
from sparse_jax.layers.sparse_qkv_attention import SparseQKVAttention
from sparse_jax.layers.counting import count_params
from sparse_jax.layers.rotary import apply_rotary

D, H, C, T, B = 8, 2, 4, 6, 2


def naive_causal_attention(p: dict, x_td: np.ndarray, rotary: bool) -> np.ndarray:
  """Vaswani et al. causal attention, one query, head and key at a time, in float64."""
  rot = naive_rotary if rotary else (lambda v, _: v)
  out = np.zeros_like(x_td)
  for i in range(len(x_td)):
    for h in range(H):
      q = rot(x_td[i] @ p["w_q"][:, h], i)
      scores = np.array([q @ rot(x_td[j] @ p["w_k"][:, h], j) / np.sqrt(C) for j in range(i + 1)])
      w = np.exp(scores - scores.max())
      w /= w.sum()
      head = sum(w[j] * (x_td[j] @ p["w_v"][:, h]) for j in range(i + 1))
      out[i] += head @ p["w_o"][h]
  return out


def make_attention(rotary: bool = True, attn_dropout: float = 0.0) -> CausalSelfAttention:
  return CausalSelfAttention(D, H, C, n_layers=2, attn_dropout=attn_dropout, rotary=rotary,
                             rngs=nnx.Rngs(0))


def random_x(seed: int, t: int = T) -> jax.Array:
  return jnp.asarray(np.random.default_rng(seed).normal(size=(B, t, D)), jnp.float32)


@pytest.mark.parametrize("rotary", [True, False])
def test_matches_naive_float64(rotary):
  attn = make_attention(rotary)
  x = random_x(1)
  p = {k: np.asarray(v, np.float64)
       for k, v in nnx.to_pure_dict(nnx.state(attn, nnx.Param)).items()}
  got = np.asarray(attn(x))
  for b in range(B):
    want = naive_causal_attention(p, np.asarray(x[b], np.float64), rotary)
    np.testing.assert_allclose(got[b], want, rtol=1e-4, atol=1e-5)


def test_future_tokens_never_change_the_past():
  attn = make_attention()
  x = random_x(2)
  t = 2
  x_changed = x.at[:, t + 1:].set(random_x(3)[:, t + 1:])
  y, y_changed = np.asarray(attn(x)), np.asarray(attn(x_changed))
  np.testing.assert_allclose(y_changed[:, :t + 1], y[:, :t + 1], atol=1e-6)
  assert np.abs(y_changed[:, t + 1:] - y[:, t + 1:]).max() > 1e-3


def test_decode_step_by_step_matches_full_forward():
  attn = make_attention(attn_dropout=0.5)
  attn.eval()
  x = random_x(4)
  # max_len > T: unwritten cache rows must stay invisible.
  np.testing.assert_allclose(decode_all(attn, x, max_len=T + 3), attn(x), rtol=1e-5, atol=1e-5)


def test_parameter_count_and_flops_closed_forms():
  attn = make_attention()
  assert count_params(attn) == 4 * D * H * C
  assert attn.flops_per_token() == 4 * D * H * C


def test_rotary_scores_depend_only_on_position_difference():
  rng = np.random.default_rng(5)
  q = jnp.asarray(rng.normal(size=(1, 1, 1, 8)), jnp.float32)
  k = jnp.asarray(rng.normal(size=(1, 1, 1, 8)), jnp.float32)

  def score(p_q: int, p_k: int) -> float:
    q_rot = apply_rotary(q, jnp.array([p_q]))
    k_rot = apply_rotary(k, jnp.array([p_k]))
    return float(jnp.sum(q_rot * k_rot))

  for d in (0, 1, 5):
    np.testing.assert_allclose(score(3, 3 + d), score(40, 40 + d), rtol=1e-4, atol=1e-5)
  assert abs(score(3, 4) - score(3, 6)) > 1e-3  # it does depend on the difference


def test_rotary_needs_even_head_dim():
  with pytest.raises(ValueError, match="even head_dim"):
    CausalSelfAttention(D, H, 3, n_layers=1, rngs=nnx.Rngs(0))


@pytest.mark.parametrize("dtype,atol", [(jnp.float32, 1e-6), (jnp.bfloat16, 1.6e-2)])
def test_one_query_attention_equals_attend_on_the_updated_cache(dtype, atol):
  """`attend_one` (decoding: the head-major cache before the update, plus the new row)
  against `attend` on the cache with the new row written at `position`, the same mask and
  dropout key. The cache's old row at `position` and the rows after it hold garbage, which
  must not be read; bfloat16 within its rounding (one ulp near 2 is 1/64)."""
  position, n_keys = 5, 9
  keys = jax.random.split(jax.random.key(3), 5)
  q = jax.random.normal(keys[0], (B, 1, H, C)).astype(dtype)
  k_old, v_old = (100 * jax.random.normal(key, (B, n_keys, H, C)).astype(dtype)
                  for key in keys[1:3])
  k_new, v_new = (jax.random.normal(key, (B, 1, H, C)).astype(dtype) for key in keys[3:])
  k, v = (old.at[:, position].set(new[:, 0]) for old, new in ((k_old, k_new), (v_old, v_new)))
  mask = (jnp.arange(n_keys) <= position)[None, :]
  head_major = lambda a: jnp.swapaxes(a, 1, 2)
  want = attend(q, k, v, mask, nnx.Dropout(0.3, rngs=nnx.Rngs(dropout=7)))
  got = attend_one(q, head_major(k_old.at[:, position].set(1e4)), head_major(v_old),
                   head_major(k_new), head_major(v_new), jnp.int32(position),
                   nnx.Dropout(0.3, rngs=nnx.Rngs(dropout=7)))
  assert got.dtype == want.dtype == dtype
  np.testing.assert_allclose(np.asarray(got, np.float32), np.asarray(want, np.float32),
                             atol=atol)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_index_after_is_the_index_whatever_the_value_it_waits_for(dtype):
  x = jnp.array([[jnp.nan, 1.0], [jnp.inf, -jnp.inf]], dtype)
  for value in (x, x[1:], -x[1:], jnp.zeros((3,), dtype)):
    for index in (0, 7, 15):
      assert int(index_after(jnp.int32(index), value, 16)) == index


@pytest.mark.parametrize("make", [
    lambda: make_attention(rotary=False),
    lambda: SparseQKVAttention(D, H, n_layers=2, n_modules=H, rotary=False, rngs=nnx.Rngs(0))],
    ids=["causal", "sparse_qkv"])
def test_decoding_writes_the_donated_cache_in_place(make):
  """The compiled decode step with its cache donated copies neither K nor V cache: without
  `index_after` ordering the row write after the reads, XLA:CPU copied each twice per step."""
  attn = make()
  attn.eval()
  cache = attn.init_cache(B, 16, jnp.float32)
  graphdef, state = nnx.split(attn)
  step = jax.jit(lambda state, cache, x: nnx.merge(graphdef, state).decode(
      x, cache, jnp.int32(3)), donate_argnums=1)
  hlo = step.lower(state, cache, random_x(6, t=1)).compile().as_text()
  entry = hlo[hlo.index("ENTRY"):]
  cache_shape = "f32[" + ",".join(map(str, cache["k"].shape)) + "]"
  copies = [line for line in entry.splitlines() if cache_shape in line and " copy(" in line]
  assert "dynamic-update-slice" in entry and not copies, copies
