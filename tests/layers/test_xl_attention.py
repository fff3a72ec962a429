"""Transformer-XL relative attention against a naive float64 numpy implementation."""

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from sparse_jax.layers.xl_attention import RelativeMultiHeadAttention, rel_shift


def naive_sinusoid(d: float, dim: int) -> np.ndarray:
  freqs = 1.0 / 10000.0 ** (np.arange(0, dim, 2) / dim)
  return np.concatenate([np.sin(d * freqs), np.cos(d * freqs)])


def naive_xl_attention(p: dict, ctx_kd: np.ndarray, t: int, mem_valid: int) -> np.ndarray:
  """Dai et al. 2019 Eq. (Sec. 3.3), one query and key at a time, in float64."""
  k_len, d_model = ctx_kd.shape
  m = k_len - t
  n_heads, head_dim = p["u_bias"].shape
  out = np.zeros((t, d_model))
  for i in range(t):
    x_i = ctx_kd[m + i]
    for h in range(n_heads):
      q = x_i @ p["w_q"][:, h]
      allowed = [j for j in range(k_len) if m - mem_valid <= j <= m + i]
      scores = []
      for j in allowed:
        key = ctx_kd[j] @ p["w_k"][:, h]
        r = naive_sinusoid(m + i - j, d_model) @ p["w_r"][:, h]
        scores.append(((q + p["u_bias"][h]) @ key + (q + p["v_bias"][h]) @ r)
                      / np.sqrt(head_dim))
      w = np.exp(np.array(scores) - max(scores))
      w /= w.sum()
      head = sum(wj * (ctx_kd[j] @ p["w_v"][:, h]) for wj, j in zip(w, allowed))
      out[i] += head @ p["w_o"][h]
  return out


def test_rel_shift_matches_index_formula():
  x = np.random.default_rng(0).normal(size=(2, 3, 5, 9)).astype(np.float32)
  got = np.asarray(rel_shift(jnp.asarray(x)))
  t, k = 5, 9
  for i in range(t):
    for j in range(k - t + i + 1):  # the causally valid part
      np.testing.assert_array_equal(got[:, :, i, j], x[:, :, i, j + t - 1 - i])


@pytest.mark.parametrize("mem_len,mem_valid", [(0, 0), (6, 6), (6, 2)])
def test_matches_naive_float64(mem_len, mem_valid):
  d_model, n_heads, head_dim, t, batch = 12, 3, 5, 5, 2
  attn = RelativeMultiHeadAttention(d_model, n_heads, head_dim, n_layers=2,
                                    rngs=nnx.Rngs(1))
  rng = np.random.default_rng(mem_len + mem_valid)
  attn.u_bias[...] = jnp.asarray(rng.normal(size=(n_heads, head_dim)), jnp.float32)
  attn.v_bias[...] = jnp.asarray(rng.normal(size=(n_heads, head_dim)), jnp.float32)
  ctx = rng.normal(size=(batch, mem_len + t, d_model)).astype(np.float32)
  got = np.asarray(attn(jnp.asarray(ctx), t, jnp.asarray(mem_valid)))
  params = {k: np.asarray(v, np.float64) for k, v in nnx.to_pure_dict(nnx.state(attn, nnx.Param)).items()}
  for b in range(batch):
    want = naive_xl_attention(params, ctx[b].astype(np.float64), t, mem_valid)
    # float32 arithmetic on O(1) values through two small contractions.
    np.testing.assert_allclose(got[b], want, rtol=1e-4, atol=1e-5)
