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

`outputs_xl.npz` (same script) holds their `SwitchHeadXL` (Transformer-XL relative positions)
on a context `x` = [3 memory rows; 4 segment rows], the memory given to their layer as its KV
cache and their `pos_offset` set to the memory length (see `make_reference.py` for why their
forward cannot be used as released); ours runs as `layer(x, 4, mem_valid=3)`. Their extra
weight maps like q and k:
  pos_to_pk [H*Dh, d] (k_pos = P W^T)  ->  w_pos = W^T as [d, H, Dh]

Two comparisons (each for both files):
- every cheap CPU impl of cvmm, the layer as it runs (float32): float32 tolerances;
- the layer's own code in float64 at float64 tolerances. Our layer is not float64 inside even
  with float64 inputs: `rotary.apply_rotary` rotates in float32 and every cvmm impl (the
  gather oracle included) multiplies and gates in float32. Those two helpers are swapped here
  for float64 versions of the same formulas, so this test checks the layer's wiring (routing,
  head offsets, gates, scale, RoPE channels and positions, mask, the head and top-K sum of O)
  to float64 rounding; the float32 kernels are what the first comparison checks. XL: no
  rotary, but `xl_attention.sinusoid_embedding` computes in float32; it is swapped too.
"""

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from float64_helpers import apply_rotary_float64, cvmm_float64

import pallas_kernels

from sparse_jax.layers import rotary
from sparse_jax.layers import switchhead_attention
from sparse_jax.layers.switchhead_attention import SwitchHeadAttention, SwitchHeadXLAttention

DATA = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data",
                    "switchhead_reference")
NPZ = os.path.join(DATA, "outputs.npz")
NPZ_XL = os.path.join(DATA, "outputs_xl.npz")
# Ours <- theirs.
NAMES = {"w_q": "q.weight", "w_k": "k.weight", "w_v": "v", "w_o": "o", "sel_v": "sel_v",
         "sel_o": "sel_o"}
NAMES_XL = dict(NAMES, w_pos="pos_to_pk")
# The impls the other SwitchHead tests run on the CPU (pallas: Triton in interpret mode).
IMPLS = ["blocked", "gather", "ragged", "pallas"]


@pytest.fixture(scope="module")
def ref():
  with np.load(NPZ) as data:
    ref = dict(data)
  d, h, c, e, k, b, t = (int(v) for v in ref["shape"])
  ref["dims"] = dict(d=d, h=h, c=c, e=e, k=k, b=b, t=t)
  return ref


@pytest.fixture(scope="module")
def ref_xl():
  with np.load(NPZ_XL) as data:
    ref = dict(data)
  d, h, c, e, k, b, m, t = (int(v) for v in ref["shape"])
  ref["dims"] = dict(d=d, h=h, c=c, e=e, k=k, b=b, m=m, t=t)
  return ref


def to_ours(name: str, value: np.ndarray, dims: dict) -> np.ndarray:
  """Their weight (or gradient) -> our layout."""
  if name in ("w_q", "w_k", "w_pos"):
    return value.T.reshape(dims["d"], dims["h"], dims["c"])
  return value


def to_theirs(name: str, value: np.ndarray, dims: dict) -> np.ndarray:
  """Our weight (or gradient) -> their layout."""
  if name in ("w_q", "w_k", "w_pos"):
    return value.reshape(dims["d"], dims["h"] * dims["c"]).T
  return value


def run_ours(ref, impl: str, dtype, xl: bool = False):
  """Our output and gradients of `sum(out * R)`, in their names and layouts (float64 numpy).
  `xl`: `SwitchHeadXLAttention` on the context `x` (memory rows first, all valid)."""
  dims = ref["dims"]
  if xl:
    names = NAMES_XL
    layer = SwitchHeadXLAttention(dims["d"], dims["h"], dims["c"], dims["e"], dims["k"],
                                  n_layers=1, impl=impl, rngs=nnx.Rngs(0))
    call = lambda layer, x: layer(x, dims["t"], jnp.asarray(dims["m"], jnp.int32))
  else:
    names = NAMES
    layer = SwitchHeadAttention(dims["d"], dims["h"], dims["c"], dims["e"], dims["k"],
                                n_layers=1, positions="rope",
                                rope_fraction=float(ref["rotate_fraction"]),
                                rope_base=float(ref["rope_base"]), impl=impl, rngs=nnx.Rngs(0))
    call = lambda layer, x: layer(x)
  for ours, theirs in names.items():
    value = jnp.asarray(to_ours(ours, ref[f"param/{theirs}"], dims), dtype)
    assert getattr(layer, ours)[...].shape == value.shape, ours
    getattr(layer, ours).set_value(value)
  graphdef, params, rest = nnx.split(layer, nnx.Param, ...)
  assert set(nnx.to_pure_dict(params)) == set(names)
  x, r = jnp.asarray(ref["x"], dtype), jnp.asarray(ref["r"], dtype)

  def loss(params, x):
    out = call(nnx.merge(graphdef, params, rest), x)
    return jnp.sum(out * r), out

  (_, out), (g_params, g_x) = jax.jit(jax.value_and_grad(loss, argnums=(0, 1), has_aux=True))(
      params, x)
  assert out.dtype == dtype and g_x.dtype == dtype
  got = {"out": np.asarray(out, np.float64), "grad/x": np.asarray(g_x, np.float64)}
  g_params = nnx.to_pure_dict(g_params)
  for ours, theirs in names.items():
    got[f"grad/{theirs}"] = to_theirs(ours, np.asarray(g_params[ours], np.float64), dims)
  return got


def assert_matches(got: dict, ref: dict, rtol: float, what: str, names=NAMES) -> None:
  """Every array within `rtol * max|theirs|` of theirs, elementwise."""
  arrays = ["out", "grad/x"] + [f"grad/{theirs}" for theirs in names.values()]
  assert set(got) == set(arrays)
  for name in arrays:
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


def test_float64_wiring_matches_authors(ref, monkeypatch):
  """float64 with the two float32 helpers swapped for float64 ones (module docstring): equal
  to their float64 run up to float64 rounding (2^-53 ~ 1e-16, times the same ~100-term sums
  and the softmax and sigmoid: observed below 1e-15 of each array's scale). 1e-10 leaves room
  for other summation orders and still catches any difference in the computation."""
  monkeypatch.setattr(rotary, "apply_rotary", apply_rotary_float64)
  monkeypatch.setattr(pallas_kernels, "cvmm", cvmm_float64)
  with jax.enable_x64(True):
    got = run_ours(ref, "gather", jnp.float64)
  assert_matches(got, ref, 1e-10, "float64")


# --- SwitchHeadXL ----------------------------------------------------------------------------

def _sinusoid_embedding_float64(distances_k, dim, *, interleaved=False):
  """`xl_attention.sinusoid_embedding` without its float32 casts (same formula)."""
  inv_freq = 1.0 / (10000.0 ** (jnp.arange(0, dim, 2, dtype=jnp.float64) / dim))
  angles_kf = distances_k.astype(jnp.float64)[:, None] * inv_freq[None, :]
  if interleaved:
    pairs_kf2 = jnp.stack([jnp.sin(angles_kf), jnp.cos(angles_kf)], axis=-1)
    return pairs_kf2.reshape(distances_k.shape[0], -1)[:, :dim]
  return jnp.concatenate([jnp.sin(angles_kf), jnp.cos(angles_kf)], axis=-1)[:, :dim]


def test_xl_reference_is_meaningful(ref_xl):
  """K < E, no near-tie in any top-K that matters (the V router on every context row, memory
  included; the O router on the segment), gradients reaching every expert row and the memory
  rows, and a position term that matters: their output with the memory offset as released
  (queries at positions 0.. instead of M..) is far from the reference."""
  ref, dims = ref_xl, ref_xl["dims"]
  assert dims["k"] < dims["e"] and dims["m"] > 0 and dims["t"] > 1
  assert ref["x"].shape == (dims["b"], dims["m"] + dims["t"], dims["d"])
  assert ref["out"].shape == ref["r"].shape == (dims["b"], dims["t"], dims["d"])
  for router, rows in (("sel_v", ref["x"]), ("sel_o", ref["x"][:, dims["m"]:])):
    scores = 1.0 / (1.0 + np.exp(-(rows @ ref[f"param/{router}"].T)))
    scores = np.sort(scores.reshape(*rows.shape[:2], dims["h"], dims["e"]), axis=-1)
    assert np.min(scores[..., -dims["k"]] - scores[..., -dims["k"] - 1]) > 1e-3, router
  for name in ("v", "o", "sel_v", "sel_o"):
    assert np.all(np.abs(ref[f"grad/{name}"]).reshape(dims["h"] * dims["e"], -1).max(1) > 0)
  assert np.all(np.abs(ref["grad/x"][:, :dims["m"]]).max(-1) > 1e-3)  # memory rows matter
  assert np.max(np.abs(ref["out_as_released"] - ref["out"])) > 0.1 * np.max(np.abs(ref["out"]))
  assert str(ref["dtype"]) == "float64" and len(str(ref["authors_commit"])) == 40


@pytest.mark.parametrize("impl", IMPLS)
def test_xl_float32_matches_authors(ref_xl, impl):
  """As `test_float32_matches_authors` (their own float32 run: 1.5e-7 to 6e-7 away)."""
  got = run_ours(ref_xl, impl, jnp.float32, xl=True)
  assert_matches(got, ref_xl, 1e-5, f"xl {impl}", NAMES_XL)


def test_xl_float64_wiring_matches_authors(ref_xl, monkeypatch):
  """As `test_float64_wiring_matches_authors`, with cvmm and the sinusoid in float64: checks
  the relative positions (offset sign and origin, sin/cos layout, scale), the memory rows
  through K, the V router and the V experts, and the mask, to float64 rounding."""
  monkeypatch.setattr(pallas_kernels, "cvmm", cvmm_float64)
  monkeypatch.setattr(switchhead_attention, "sinusoid_embedding", _sinusoid_embedding_float64)
  with jax.enable_x64(True):
    got = run_ours(ref_xl, "gather", jnp.float64, xl=True)
  assert_matches(got, ref_xl, 1e-10, "xl float64", NAMES_XL)
