"""Dense attention with Q, K, V and output biases (Trax's `tl.Dense` projections) against
float64 numpy: causal (`CausalSelfAttention(use_bias=True)`) and bidirectional."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from attention_testing import decode_all, naive_rotary
from float64_testing import float64_function, numpy_params
from sparse_jax.layers.bidirectional_attention import BidirectionalSelfAttention
from sparse_jax.layers.causal_attention import CausalSelfAttention
from sparse_jax.layers.counting import count_params

D, H, C, T, B = 8, 2, 4, 6, 2


def naive_causal(p: dict, x_td: np.ndarray, rotary: bool) -> np.ndarray:
  """One query, head and key at a time: `q = x W_q[:, h] + b_q[h]` (then rotated), likewise
  k and v; `y = sum_h softmax(q k / sqrt(C)) v W_o[h] + b_o`."""
  rot = naive_rotary if rotary else (lambda v, _: v)
  out = np.tile(p["b_o"], (len(x_td), 1))
  for i in range(len(x_td)):
    for h in range(H):
      q = rot(x_td[i] @ p["w_q"][:, h] + p["b_q"][h], i)
      keys = [rot(x_td[j] @ p["w_k"][:, h] + p["b_k"][h], j) for j in range(i + 1)]
      scores = np.array([q @ k / np.sqrt(C) for k in keys])
      w = np.exp(scores - scores.max())
      w /= w.sum()
      head = sum(w[j] * (x_td[j] @ p["w_v"][:, h] + p["b_v"][h]) for j in range(i + 1))
      out[i] += head @ p["w_o"][h]
  return out


def naive_bidirectional(p: dict, x_td: np.ndarray, valid_t: np.ndarray) -> np.ndarray:
  """Every query over the valid keys; heads are consecutive `C`-channel slices."""
  q, k, v = (x_td @ p[n]["kernel"] + p[n]["bias"] for n in ("query", "key", "value"))
  heads = []
  for h in range(H):
    sl = slice(h * C, (h + 1) * C)
    scores = q[:, sl] @ k[:, sl].T / np.sqrt(C)
    scores = np.where(valid_t[None, :], scores, -np.inf)
    w = np.exp(scores - scores.max(-1, keepdims=True))
    heads.append((w / w.sum(-1, keepdims=True)) @ v[:, sl])
  return np.concatenate(heads, -1) @ p["out"]["kernel"] + p["out"]["bias"]


def randomize_biases(module: nnx.Module, seed: int) -> None:
  """Biases start at zero; the tests need them to matter."""
  rng = np.random.default_rng(seed)
  for path, param in nnx.iter_graph(module):
    if isinstance(param, nnx.Param) and path[-1] in ("b_q", "b_k", "b_v", "b_o", "bias"):
      param[...] = jnp.asarray(rng.normal(size=param.shape), jnp.float32)


def causal(rotary: bool = False) -> CausalSelfAttention:
  attn = CausalSelfAttention(D, H, C, n_layers=2, rotary=rotary, use_bias=True, rngs=nnx.Rngs(0))
  randomize_biases(attn, 1)
  return attn


def bidirectional() -> BidirectionalSelfAttention:
  attn = BidirectionalSelfAttention(D, H, init_std=0.3, rngs=nnx.Rngs(0))
  randomize_biases(attn, 1)
  return attn


def random_x(seed: int) -> np.ndarray:
  return np.random.default_rng(seed).normal(size=(B, T, D))


VALID = np.array([[True] * T, [True] * 4 + [False] * (T - 4)])


def naive(kind: str, p: dict, x: np.ndarray, rotary: bool = False) -> np.ndarray:
  if kind == "causal":
    return np.stack([naive_causal(p, x_td, rotary) for x_td in x])
  return np.stack([naive_bidirectional(p, x_td, v_t) for x_td, v_t in zip(x, VALID)])


def call(kind: str, attn, x):
  return attn(x) if kind == "causal" else attn(x, jnp.asarray(VALID))


@pytest.mark.parametrize("kind,rotary", [("causal", False), ("causal", True),
                                         ("bidirectional", False)])
def test_matches_naive_float64(kind, rotary):
  attn = causal(rotary) if kind == "causal" else bidirectional()
  x = random_x(2)
  want = naive(kind, numpy_params(attn), x, rotary)
  np.testing.assert_allclose(call(kind, attn, jnp.asarray(x, jnp.float32)), want,
                             rtol=1e-4, atol=1e-5)
  if not rotary:  # (The rotary angles are float32 whatever the input.)
    with jax.enable_x64(True):
      f, params = float64_function(attn, lambda m, x: call(kind, m, x))
      np.testing.assert_allclose(f(params, jnp.asarray(x)), want, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("kind", ["causal", "bidirectional"])
def test_float64_gradients_match_finite_differences_of_the_numpy_reference(kind):
  """Directional derivatives of `sum(y * cot)` along random directions over every parameter
  (biases included) and the input: float64 autodiff against central differences of numpy."""
  attn = causal() if kind == "causal" else bidirectional()
  x, cot = random_x(3), random_x(4)
  p = numpy_params(attn)
  with jax.enable_x64(True):
    f, params = float64_function(attn, lambda m, x: call(kind, m, x))
    g_params, g_x = jax.grad(lambda params, x: jnp.sum(f(params, x) * cot),
                             argnums=(0, 1))(params, jnp.asarray(x))
    g_params = nnx.to_pure_dict(g_params)
  rng = np.random.default_rng(5)
  for _ in range(2):
    v_p = jax.tree.map(lambda a: rng.normal(size=a.shape), p)
    v_x = rng.normal(size=x.shape)

    def moved(eps):
      return np.sum(cot * naive(kind, jax.tree.map(lambda a, d: a + eps * d, p, v_p),
                                x + eps * v_x))

    numeric = (moved(1e-6) - moved(-1e-6)) / 2e-6
    analytic = float(np.sum(np.asarray(g_x) * v_x)) + sum(
        float(np.sum(np.asarray(g) * d))
        for g, d in zip(jax.tree.leaves(g_params), jax.tree.leaves(v_p), strict=True))
    np.testing.assert_allclose(analytic, numeric, rtol=1e-7, atol=1e-8)
  # The biases were among the directions; q, v and output biases receive gradient, the key
  # bias none (it shifts all of a query's scores alike, which the softmax ignores).
  names = (("b_q", "b_k", "b_v", "b_o") if kind == "causal"
           else tuple((n, "bias") for n in ("query", "key", "value", "out")))
  grad_of = lambda name: np.abs(  # noqa: E731
      g_params[name] if isinstance(name, str) else g_params[name[0]][name[1]]).max()
  assert min(grad_of(n) for n in names[:1] + names[2:]) > 1e-3
  assert grad_of(names[1]) < 1e-12


def test_decode_with_the_cache_uses_the_biases_as_the_full_forward():
  attn = causal()
  x = jnp.asarray(random_x(6), jnp.float32)
  want = attn(x)
  np.testing.assert_allclose(decode_all(attn, x, max_len=T + 2), want, rtol=1e-5, atol=1e-5)
  unbiased = nnx.clone(attn)
  unbiased.b_o[...] = jnp.zeros((D,))
  assert np.abs(unbiased(x) - want).max() > 1e-2  # The check above saw the biases.


def test_biases_are_optional_zero_initialised_and_declare_their_axes():
  plain = CausalSelfAttention(D, H, C, n_layers=2, rngs=nnx.Rngs(0))
  biased = CausalSelfAttention(D, H, C, n_layers=2, use_bias=True, rngs=nnx.Rngs(0))
  assert plain.b_q is None and count_params(plain) == 4 * D * H * C
  assert count_params(biased) == 4 * D * H * C + 3 * H * C + D
  for name in ("w_q", "w_k", "w_v", "w_o"):  # The same kernels from the same seed.
    np.testing.assert_array_equal(getattr(plain, name)[...], getattr(biased, name)[...])
  for name, axes in (("b_q", ("heads", "head_dim")), ("b_k", ("heads", "head_dim")),
                     ("b_v", ("heads", "head_dim")), ("b_o", ("embed",))):
    param = getattr(biased, name)
    assert param.get_metadata()["logical_axes"] == axes
    np.testing.assert_array_equal(param[...], 0.0)
  assert biased.flops_per_token() == plain.flops_per_token()
