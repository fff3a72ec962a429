"""Scaling Transformers' sparse QKV attention (Sec. 3.2) against naive float64 numpy.

The reference follows Trax 1.4 `MultiplicativeConvCausalAttention`: `FactoredDense` with bias,
per-projection convolutions over (length, module), then the `[S, M]` grid flattened to
`d_model` and split into H heads (S may differ from H), no output layer.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from attention_testing import decode_all, naive_conv, naive_rotary
from float64_testing import numpy_params
from sparse_jax.layers.counting import count_params
from sparse_jax.layers.sparse_qkv_attention import SparseQKVAttention
from sparse_jax.models import accounting
from sparse_jax.models.blocks import build_attention
from sparse_jax.models.lm_config import validate_model_config

D, T, B = 12, 6, 2
REFERENCE_KERNELS = {"q_kernel": (3, 3), "k_kernel": (3, 3), "v_kernel": (3, 1)}
# Even module kernel (padding 0 before, 1 after), length-1 kernel, and a longest F_len of 4.
ODD_KERNELS = {"q_kernel": (2, 2), "k_kernel": (1, 3), "v_kernel": (4, 1)}


def naive_sparse_qkv(p: dict, x_td: np.ndarray, n_heads: int, rotary: bool) -> np.ndarray:
  """mult (with bias), three convolutions, flatten `[S, M]` to `d_model`, split into H heads,
  per-head causal attention with scale `1/sqrt(d_model / H)`, no output layer."""
  n_t = len(x_td)
  n_s = p["mult"]["d_is"].shape[1]
  y_tsm = np.einsum("ti,is,im->tsm", x_td, p["mult"]["d_is"], p["mult"]["e_im"])
  y_tsm = y_tsm + p["mult"]["bias"].reshape(n_s, -1)
  hd = D // n_heads
  q, k, v = (naive_conv(y_tsm, p[name]["kernel"], p[name]["bias"]).reshape(n_t, n_heads, hd)
             for name in ("conv_q", "conv_k", "conv_v"))
  rot = naive_rotary if rotary else (lambda vec, _: vec)
  out = np.zeros((n_t, n_heads, hd))
  for i in range(n_t):
    for h in range(n_heads):
      q_i = rot(q[i, h], i)
      scores = np.array([q_i @ rot(k[j, h], j) / np.sqrt(hd) for j in range(i + 1)])
      w = np.exp(scores - scores.max())
      w /= w.sum()
      out[i, h] = sum(w[j] * v[j, h] for j in range(i + 1))
  return out.reshape(n_t, D)


# (S, H, kernels, rotary): S = H as the 800M model; S > H; S < H (a head spans modules, as
# the 17B model's 96 heads over S = 64) with the odd kernels.
CASES = {"s3_h3": (3, 3, REFERENCE_KERNELS, True),
         "s4_h2": (4, 2, REFERENCE_KERNELS, True),
         "s2_h6": (2, 6, ODD_KERNELS, False)}


def make_attention(case: str, attn_dropout: float = 0.0, seed: int = 0) -> SparseQKVAttention:
  """A layer of `CASES[case]` whose multiplicative and convolution biases are random, nonzero."""
  s, h, kernels, rotary = CASES[case]
  attn = SparseQKVAttention(D, h, n_modules=s, n_layers=2, attn_dropout=attn_dropout,
                            rotary=rotary, rngs=nnx.Rngs(seed), **kernels)
  rng = np.random.default_rng(seed + 100)
  for bias in (attn.mult.bias, attn.conv_q.bias, attn.conv_k.bias, attn.conv_v.bias):
    bias[...] = jnp.asarray(rng.normal(size=bias.shape), jnp.float32)
  return attn


def naive_case(case: str, p: dict, x_btd: np.ndarray) -> np.ndarray:
  _, h, _, rotary = CASES[case]
  return np.stack([naive_sparse_qkv(p, x_td, h, rotary) for x_td in x_btd])


def random_x(seed: int) -> jax.Array:
  return jnp.asarray(np.random.default_rng(seed).normal(size=(B, T, D)), jnp.float32)


@pytest.mark.parametrize("case", sorted(CASES))
def test_matches_naive_float64(case):
  attn = make_attention(case)
  x = random_x(1)
  want = naive_case(case, numpy_params(attn), np.asarray(x, np.float64))
  np.testing.assert_allclose(attn(x), want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("case", ["s4_h2", "s2_h6"])
def test_gradients_match_finite_differences_of_the_numpy_reference(case):
  """<grad, v> of `sum(y * cot)` (float32 autodiff) equals the float64 central difference of
  the numpy reference along random directions v over every parameter and the input."""
  attn = make_attention(case)
  x = np.random.default_rng(7).normal(size=(B, T, D))
  cot = np.random.default_rng(8).normal(size=(B, T, D))
  graphdef, params, rest = nnx.split(attn, nnx.Param, ...)

  def loss(params, x):
    return jnp.sum(nnx.merge(graphdef, params, rest)(x) * jnp.asarray(cot, jnp.float32))

  g_params, g_x = jax.grad(loss, argnums=(0, 1))(params, jnp.asarray(x, jnp.float32))
  g_params = jax.tree.map(lambda a: np.asarray(a, np.float64), nnx.to_pure_dict(g_params))
  p = numpy_params(attn)
  rng = np.random.default_rng(9)
  for _ in range(3):
    v_p = jax.tree.map(lambda a: rng.normal(size=a.shape), p)
    v_x = rng.normal(size=x.shape)
    moved = lambda eps: np.sum(cot * naive_case(  # noqa: E731
        case, jax.tree.map(lambda a, d: a + eps * d, p, v_p), x + eps * v_x))
    h = 1e-5
    numeric = (moved(h) - moved(-h)) / (2 * h)
    analytic = float(np.sum(g_x * v_x)) + sum(
        float(np.sum(g * d)) for g, d in zip(jax.tree.leaves(g_params), jax.tree.leaves(v_p)))
    np.testing.assert_allclose(analytic, numeric, rtol=2e-4, atol=1e-4)


def test_future_tokens_never_change_the_past():
  attn = make_attention("s3_h3")
  x = random_x(2)
  for t in (0, 3):
    x_changed = x.at[:, t + 1:].set(random_x(3)[:, t + 1:])
    y, y_changed = np.asarray(attn(x)), np.asarray(attn(x_changed))
    np.testing.assert_allclose(y_changed[:, :t + 1], y[:, :t + 1], atol=1e-6)
    assert np.abs(y_changed[:, t + 1:] - y[:, t + 1:]).max() > 1e-3


def test_length_convolution_reads_exactly_the_last_f_len_tokens():
  """The convolution alone: changing token u changes outputs u .. u + F_len - 1 only."""
  attn = make_attention("s3_h3")
  conv = attn.conv_q  # F_len = 3
  y = jnp.asarray(np.random.default_rng(6).normal(size=(B, T, 3, attn.module_size)),
                  jnp.float32)
  u = 2
  out, out_changed = np.asarray(conv(y)), np.asarray(conv(y.at[:, u].add(1.0)))
  np.testing.assert_allclose(out_changed[:, :u], out[:, :u], atol=1e-6)
  assert np.abs(out_changed[:, u:u + 3] - out[:, u:u + 3]).max(axis=(0, 2, 3)).min() > 1e-3
  np.testing.assert_allclose(out_changed[:, u + 3:], out[:, u + 3:], atol=1e-6)


@pytest.mark.parametrize("case", sorted(CASES))
def test_decode_step_by_step_matches_full_forward(case):
  attn = make_attention(case, attn_dropout=0.5)
  attn.eval()
  x = random_x(4)
  # max_len > T: unwritten cache rows must stay invisible.
  np.testing.assert_allclose(decode_all(attn, x, max_len=T + 3), attn(x), rtol=1e-5, atol=1e-5)


def test_cache_holds_the_convolution_window_in_modules_and_keys_in_heads():
  cache = make_attention("s2_h6").init_cache(B, 10, jnp.bfloat16)
  assert cache["mult"].shape == (B, 3, 2, 6)  # longest F_len is 4; S = 2 modules of M = 6
  assert cache["k"].shape == cache["v"].shape == (B, 6, 10, 2)  # H = 6 heads of 2, head-major
  assert all(a.dtype == jnp.bfloat16 for a in cache.values())


@pytest.mark.parametrize("case", sorted(CASES))
def test_parameter_count_and_flops_closed_forms(case):
  s, _, kernels, _ = CASES[case]
  m = D // s
  attn = make_attention(case)
  taps = sum(f_len * f_mod for f_len, f_mod in kernels.values())
  assert count_params(attn) == D * (s + m) + D + taps * m * m + 3 * m
  assert attn.flops_per_token() == D * (s + D) + s * taps * m * m


def test_model_config_attention_sparsity_reaches_the_layer_and_the_accounting():
  cfg = dict(vocab_size=32, d_model=D, n_layers=2, n_heads=6, mem_len=0, dropout=0.0,
             attention="sparse_qkv", attention_sparsity=4,
             ff={"kind": "dense", "d_ff": 16})
  taps = 3 * 3 + 3 * 3 + 3 * 1
  assert accounting.attention_params(cfg) == D * (4 + 3) + D + taps * 3 * 3 + 3 * 3
  attn = build_attention(validate_model_config(cfg), nnx.Rngs(0))
  assert (attn.n_modules, attn.module_size, attn.n_heads, attn.head_dim) == (4, 3, 6, 2)


def test_mult_init_option_and_divisibility_errors():
  unit = SparseQKVAttention(D, 3, n_layers=1, mult_init="unit", rngs=nnx.Rngs(0))
  trax = SparseQKVAttention(D, 3, n_layers=1, rngs=nnx.Rngs(0))
  assert float(jnp.std(unit.mult.d_is[...])) > 1.5 * float(jnp.std(trax.mult.d_is[...]))
  with pytest.raises(ValueError, match="divisible by n_heads"):
    SparseQKVAttention(10, 3, n_layers=1, rngs=nnx.Rngs(0))
  with pytest.raises(ValueError, match="divisible by n_modules"):
    SparseQKVAttention(12, 3, n_modules=5, n_layers=1, rngs=nnx.Rngs(0))
