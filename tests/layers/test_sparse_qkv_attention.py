"""Scaling Transformers' sparse QKV attention (Sec. 3.2) against naive float64 numpy."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from attention_testing import decode_all, naive_rotary
from sparse_jax.layers.counting import count_params
from sparse_jax.layers.sparse_qkv_attention import SparseQKVAttention

D, S, T, B = 12, 3, 6, 2
M = D // S
REFERENCE_KERNELS = {"q_kernel": (3, 3), "k_kernel": (3, 3), "v_kernel": (3, 1)}
# Even module kernel (padding 0 before, 1 after), length-1 kernel, and a longest F_len of 4.
ODD_KERNELS = {"q_kernel": (2, 2), "k_kernel": (1, 3), "v_kernel": (4, 1)}


def naive_conv(y_tsm: np.ndarray, kernel: np.ndarray, bias: np.ndarray) -> np.ndarray:
  """Explicit loop over the kernel taps: tap a reads token `t - (F_len-1) + a`, tap b reads
  module `s - (F_mod-1)//2 + b`; taps outside the sequence or the modules read zeros."""
  f_len, f_mod = kernel.shape[:2]
  n_t, n_s, _ = y_tsm.shape
  out = np.zeros_like(y_tsm)
  for t in range(n_t):
    for s in range(n_s):
      out[t, s] = bias
      for a in range(f_len):
        for b in range(f_mod):
          tt, ss = t - (f_len - 1) + a, s - (f_mod - 1) // 2 + b
          if tt >= 0 and 0 <= ss < n_s:
            out[t, s] += y_tsm[tt, ss] @ kernel[a, b]
  return out


def naive_sparse_qkv(p: dict, x_td: np.ndarray, rotary: bool) -> np.ndarray:
  """mult, three convolutions, then per-head causal attention with no output layer."""
  y_tsm = np.einsum("ti,is,im->tsm", x_td, p["mult"]["d_is"], p["mult"]["e_im"])
  q, k, v = (naive_conv(y_tsm, p[name]["kernel"], p[name]["bias"])
             for name in ("conv_q", "conv_k", "conv_v"))
  rot = naive_rotary if rotary else (lambda vec, _: vec)
  out = np.zeros((len(x_td), S, M))
  for i in range(len(x_td)):
    for h in range(S):
      q_i = rot(q[i, h], i)
      scores = np.array([q_i @ rot(k[j, h], j) / np.sqrt(M) for j in range(i + 1)])
      w = np.exp(scores - scores.max())
      w /= w.sum()
      out[i, h] = sum(w[j] * v[j, h] for j in range(i + 1))
  return out.reshape(len(x_td), D)


def make_attention(kernels: dict, rotary: bool = True, attn_dropout: float = 0.0,
                   seed: int = 0) -> SparseQKVAttention:
  """A layer whose convolution biases are random and nonzero."""
  attn = SparseQKVAttention(D, S, n_layers=2, attn_dropout=attn_dropout, rotary=rotary,
                            rngs=nnx.Rngs(seed), **kernels)
  rng = np.random.default_rng(seed + 100)
  for conv in (attn.conv_q, attn.conv_k, attn.conv_v):
    conv.bias[...] = jnp.asarray(rng.normal(size=(M,)), jnp.float32)
  return attn


def random_x(seed: int) -> jax.Array:
  return jnp.asarray(np.random.default_rng(seed).normal(size=(B, T, D)), jnp.float32)


@pytest.mark.parametrize("kernels,rotary", [(REFERENCE_KERNELS, True),
                                            (ODD_KERNELS, False)])
def test_matches_naive_float64(kernels, rotary):
  attn = make_attention(kernels, rotary)
  x = random_x(1)
  p = jax.tree.map(lambda a: np.asarray(a, np.float64),
                   nnx.to_pure_dict(nnx.state(attn, nnx.Param)))
  got = np.asarray(attn(x))
  for b in range(B):
    want = naive_sparse_qkv(p, np.asarray(x[b], np.float64), rotary)
    np.testing.assert_allclose(got[b], want, rtol=1e-4, atol=1e-5)


def test_future_tokens_never_change_the_past():
  attn = make_attention(REFERENCE_KERNELS)
  x = random_x(2)
  for t in (0, 3):
    x_changed = x.at[:, t + 1:].set(random_x(3)[:, t + 1:])
    y, y_changed = np.asarray(attn(x)), np.asarray(attn(x_changed))
    np.testing.assert_allclose(y_changed[:, :t + 1], y[:, :t + 1], atol=1e-6)
    assert np.abs(y_changed[:, t + 1:] - y[:, t + 1:]).max() > 1e-3


def test_length_convolution_reads_exactly_the_last_f_len_tokens():
  """The convolution alone: changing token u changes outputs u .. u + F_len - 1 only."""
  conv = make_attention(REFERENCE_KERNELS).conv_q  # F_len = 3
  y = jnp.asarray(np.random.default_rng(6).normal(size=(B, T, S, M)), jnp.float32)
  u = 2
  out, out_changed = np.asarray(conv(y)), np.asarray(conv(y.at[:, u].add(1.0)))
  np.testing.assert_allclose(out_changed[:, :u], out[:, :u], atol=1e-6)
  assert np.abs(out_changed[:, u:u + 3] - out[:, u:u + 3]).max(axis=(0, 2, 3)).min() > 1e-3
  np.testing.assert_allclose(out_changed[:, u + 3:], out[:, u + 3:], atol=1e-6)


@pytest.mark.parametrize("kernels", [REFERENCE_KERNELS, ODD_KERNELS])
def test_decode_step_by_step_matches_full_forward(kernels):
  attn = make_attention(kernels, attn_dropout=0.5)
  attn.eval()
  x = random_x(4)
  # max_len > T: unwritten cache rows must stay invisible.
  np.testing.assert_allclose(decode_all(attn, x, max_len=T + 3), attn(x), rtol=1e-5, atol=1e-5)


def test_cache_holds_the_convolution_window():
  cache = make_attention(ODD_KERNELS).init_cache(B, 10, jnp.bfloat16)
  assert cache["mult"].shape == (B, 3, S, M)  # longest F_len is 4
  assert cache["k"].shape == cache["v"].shape == (B, 10, S, M)
  assert all(a.dtype == jnp.bfloat16 for a in cache.values())


@pytest.mark.parametrize("kernels", [REFERENCE_KERNELS, ODD_KERNELS])
def test_parameter_count_and_flops_closed_forms(kernels):
  attn = make_attention(kernels)
  taps = sum(f_len * f_mod for f_len, f_mod in kernels.values())
  assert count_params(attn) == D * (S + M) + taps * M * M + 3 * M
  assert attn.flops_per_token() == D * (S + D) + S * taps * M * M


def test_d_model_must_divide_into_heads():
  with pytest.raises(ValueError, match="divisible by n_heads"):
    SparseQKVAttention(10, 3, n_layers=1, rngs=nnx.Rngs(0))
