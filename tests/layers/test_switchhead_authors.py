"""SwitchHead attention against the authors' PyTorch layer, on the same weights and input.

`tests/data/switchhead_reference/outputs.npz` holds the output and the gradients of
`sum(out * R)` (wrt x and every weight) of their `SwitchHeadRope` (RobertCsordas/switchhead,
`switchhead/switchhead.py`; the commit and torch version are in the npz), run in float64 by
`make_reference.py` there, which also says what its harness changes to run their code on a
CPU in float64 (Triton kernels emulated, their float32 router logits and RoPE frequencies kept
in float64). Nothing here needs torch or their code.

Their weights map to ours as (expert e of head h is row h*E + e on both sides):
  q.weight, k.weight [H*Dh, d] (torch Linear, y = x W^T)  ->  w_q, w_k = W^T as [d, H, Dh]
  v [H*E, d, Dh], o [H*E, Dh, d], sel_v, sel_o [H*E, d]  ->  w_v, w_o, sel_v, sel_o as they are

Two comparisons:
- every cheap CPU impl of cvmm, the layer as it runs (float32): float32 tolerances;
- the layer's own code in float64 at float64 tolerances. Our layer is not float64 inside even
  with float64 inputs: `rotary.apply_rotary` rotates in float32 and every cvmm impl (the
  gather oracle included) multiplies and gates in float32. Those two helpers are swapped here
  for float64 versions of the same formulas, so this test checks the layer's wiring (routing,
  head offsets, gates, scale, RoPE channels and positions, mask, the head and top-K sum of O)
  to float64 rounding; the float32 kernels are what the first comparison checks.
"""

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from sparse_jax.layers import rotary
from sparse_jax.layers import switchhead_attention
from sparse_jax.layers.switchhead_attention import SwitchHeadAttention

NPZ = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data",
                   "switchhead_reference", "outputs.npz")
# Ours <- theirs.
NAMES = {"w_q": "q.weight", "w_k": "k.weight", "w_v": "v", "w_o": "o", "sel_v": "sel_v",
         "sel_o": "sel_o"}
# The impls the other SwitchHead tests run on the CPU (pallas: Triton in interpret mode).
IMPLS = ["blocked", "gather", "ragged", "pallas"]


@pytest.fixture(scope="module")
def ref():
  with np.load(NPZ) as data:
    ref = dict(data)
  d, h, c, e, k, b, t = (int(v) for v in ref["shape"])
  ref["dims"] = dict(d=d, h=h, c=c, e=e, k=k, b=b, t=t)
  return ref


def to_ours(name: str, value: np.ndarray, dims: dict) -> np.ndarray:
  """Their weight (or gradient) -> our layout."""
  if name in ("w_q", "w_k"):
    return value.T.reshape(dims["d"], dims["h"], dims["c"])
  return value


def to_theirs(name: str, value: np.ndarray, dims: dict) -> np.ndarray:
  """Our weight (or gradient) -> their layout."""
  if name in ("w_q", "w_k"):
    return value.reshape(dims["d"], dims["h"] * dims["c"]).T
  return value


def run_ours(ref, impl: str, dtype):
  """Our output and gradients of `sum(out * R)`, in their names and layouts (float64 numpy)."""
  dims = ref["dims"]
  layer = SwitchHeadAttention(dims["d"], dims["h"], dims["c"], dims["e"], dims["k"], n_layers=1,
                              positions="rope", rope_fraction=float(ref["rotate_fraction"]),
                              rope_base=float(ref["rope_base"]), impl=impl, rngs=nnx.Rngs(0))
  for ours, theirs in NAMES.items():
    value = jnp.asarray(to_ours(ours, ref[f"param/{theirs}"], dims), dtype)
    assert getattr(layer, ours)[...].shape == value.shape, ours
    getattr(layer, ours).set_value(value)
  graphdef, params, rest = nnx.split(layer, nnx.Param, ...)
  x, r = jnp.asarray(ref["x"], dtype), jnp.asarray(ref["r"], dtype)

  def loss(params, x):
    out = nnx.merge(graphdef, params, rest)(x)
    return jnp.sum(out * r), out

  (_, out), (g_params, g_x) = jax.jit(jax.value_and_grad(loss, argnums=(0, 1), has_aux=True))(
      params, x)
  assert out.dtype == dtype and g_x.dtype == dtype
  got = {"out": np.asarray(out, np.float64), "grad/x": np.asarray(g_x, np.float64)}
  g_params = nnx.to_pure_dict(g_params)
  for ours, theirs in NAMES.items():
    got[f"grad/{theirs}"] = to_theirs(ours, np.asarray(g_params[ours], np.float64), dims)
  return got


def assert_matches(got: dict, ref: dict, rtol: float, what: str) -> None:
  """Every array within `rtol * max|theirs|` of theirs, elementwise."""
  names = ["out", "grad/x"] + [f"grad/{theirs}" for theirs in NAMES.values()]
  for name in names:
    want = ref[name]
    assert got[name].shape == want.shape, name
    err = np.max(np.abs(got[name] - want)) / np.max(np.abs(want))
    assert err <= rtol, f"{what} {name}: max |ours - theirs| / max |theirs| = {err:.2e}"


def test_reference_is_meaningful(ref):
  """K < E with no near-tie in any top-K (a float32 rounding cannot flip a choice), and the
  gradients reach every expert row of every weight."""
  dims = ref["dims"]
  assert dims["k"] < dims["e"] and 0 < int(dims["c"] * ref["rotate_fraction"]) < dims["c"]
  for router in ("sel_v", "sel_o"):
    scores = 1.0 / (1.0 + np.exp(-(ref["x"] @ ref[f"param/{router}"].T)))
    scores = np.sort(scores.reshape(dims["b"], dims["t"], dims["h"], dims["e"]), axis=-1)
    assert np.min(scores[..., -dims["k"]] - scores[..., -dims["k"] - 1]) > 1e-3, router
  for name in ("v", "o", "sel_v", "sel_o"):
    assert np.all(np.abs(ref[f"grad/{name}"]).reshape(dims["h"] * dims["e"], -1).max(1) > 0)
  assert str(ref["dtype"]) == "float64" and len(str(ref["authors_commit"])) == 40


@pytest.mark.parametrize("impl", IMPLS)
def test_float32_matches_authors(ref, impl):
  """float32 (the layer's compute dtype; cvmm and scores accumulate in float32) against
  their float64: the arrays hold sums of at most ~100 terms of order one, so float32 rounding
  (2^-24 ~ 6e-8) leaves ~1e-6 of the array's scale; their own code run in float32 on these
  weights is 2.3e-7 to 3.6e-7 away (`max_rel_their_float32` in the npz). 1e-5: 30x that."""
  assert_matches(run_ours(ref, impl, jnp.float32), ref, 1e-5, impl)


def _apply_rotary_float64(x_bthc, positions_t, base=10000.0):
  """`rotary.apply_rotary` without its float32 casts (same formula)."""
  dim = x_bthc.shape[-1]
  inv_freq = base ** (-jnp.arange(0, dim, 2, dtype=x_bthc.dtype) / dim)
  angles = positions_t.astype(x_bthc.dtype)[:, None] * inv_freq[None, :]
  angles = jnp.concatenate([angles, angles], axis=-1)
  return x_bthc * jnp.cos(angles)[:, None, :] + rotary.rotate_half(x_bthc) * jnp.sin(angles)[
      :, None, :]


def _cvmm_float64(x, sel, w, gates=None, *, impl):
  """The cvmm contract (`pallas_kernels.cvmm`) by gather, in the input dtype."""
  del impl
  w_nkml = jnp.take(w, sel, axis=0)
  spec = "nm,nkml->nkl" if x.ndim == 2 else "nkm,nkml->nkl"
  y_nkl = jnp.einsum(spec, x, w_nkml, precision="highest")
  return y_nkl if gates is None else jnp.einsum("nk,nkl->nl", gates, y_nkl, precision="highest")


def test_float64_wiring_matches_authors(ref, monkeypatch):
  """float64 with the two float32 helpers swapped for float64 ones (module docstring): equal
  to their float64 run up to float64 rounding (2^-53 ~ 1e-16, times the same ~100-term sums
  and the softmax and sigmoid: observed below 1e-15 of each array's scale). 1e-10 leaves room
  for other summation orders and still catches any difference in the computation."""
  monkeypatch.setattr(switchhead_attention, "apply_rotary", _apply_rotary_float64)
  monkeypatch.setattr(switchhead_attention, "cvmm", _cvmm_float64)
  with jax.enable_x64(True):
    got = run_ours(ref, "gather", jnp.float64)
  assert_matches(got, ref, 1e-10, "float64")
