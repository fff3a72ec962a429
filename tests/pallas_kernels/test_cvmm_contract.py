"""cvmm's contract at its edges: the impl `auto` picks, errors naming the bad argument, expert
ids out of range (an error when concrete, clipped under jit) and where NaNs go.

(Values and gradients of every impl: test_cvmm_numerics.py.)
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pallas_kernels import cvmm
from cvmm_testing import CASES, IMPLS, make_inputs


@pytest.mark.skipif(jax.default_backend() == "gpu", reason="auto is pallas on a GPU")
def test_auto_is_blocked_off_gpu():
  x, sel, w, gates, _ = make_inputs(CASES[1])
  auto = cvmm(x, sel, w, gates)
  np.testing.assert_array_equal(auto, cvmm(x, sel, w, gates, impl="blocked"))


@pytest.mark.skipif(jax.default_backend() == "gpu", reason="checks the CPU refusal")
def test_mosaic_off_gpu_says_where_it_runs():
  x, sel, w, gates, _ = make_inputs(CASES[1])
  with pytest.raises(ValueError, match="impl='mosaic' runs on NVIDIA Hopper GPUs only"):
    cvmm(x, sel, w, gates, impl="mosaic")


_GOOD = dict(x=np.ones((4, 8), np.float32), sel=np.zeros((4, 2), np.int32),
             w=np.ones((3, 8, 16), np.float32), gates=None)


@pytest.mark.parametrize("override, argument", [
    (dict(impl="triton"), "impl"),
    (dict(w=np.ones((8, 16), np.float32)), "w"),
    (dict(sel=np.zeros((4,), np.int32)), "sel"),
    (dict(sel=np.zeros((4, 2), np.float32)), "sel"),
    (dict(x=np.ones((4, 9), np.float32)), "x"),
    (dict(x=np.ones((4, 3, 8), np.float32)), "x"),
    (dict(x=np.ones((4, 8), np.int32)), "x"),
    (dict(w=np.ones((3, 8, 16), jnp.bfloat16)), "w"),
    (dict(gates=np.ones((4, 3), np.float32)), "gates"),
    (dict(gates=np.ones((4, 2), np.int32)), "gates"),
])
def test_invalid_inputs_raise_naming_the_argument(override, argument):
  kwargs = {**_GOOD, **override}
  impl = kwargs.pop("impl", "auto")
  with pytest.raises(ValueError, match=f"^{argument} "):
    cvmm(kwargs["x"], kwargs["sel"], kwargs["w"], kwargs["gates"], impl=impl)


@pytest.mark.parametrize("bad_id", [-1, 3, 100])
def test_concrete_ids_out_of_range_raise(bad_id):
  sel = _GOOD["sel"].copy()
  sel[2, 1] = bad_id
  with pytest.raises(ValueError, match=rf"^sel must hold expert ids in \[0, 3\).*{bad_id}"):
    cvmm(_GOOD["x"], sel, _GOOD["w"])


@pytest.mark.parametrize("impl", IMPLS)
def test_traced_ids_out_of_range_are_clipped(impl):
  """Under jit the ids cannot be read without a sync: every impl clips them, as documented."""
  x, sel, w, gates, _ = make_inputs(CASES[1])
  wild = np.asarray(sel).copy()
  wild[0, 0], wild[3, 1] = -5, w.shape[0] + 7
  got = jax.jit(lambda s: cvmm(x, s, w, gates, impl=impl))(wild)
  clipped = np.clip(wild, 0, w.shape[0] - 1)
  np.testing.assert_allclose(got, cvmm(x, clipped, w, gates, impl="gather"), rtol=1e-5,
                             atol=1e-5)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("where", ["token", "expert"])
def test_nans_reach_only_their_outputs(impl, where):
  """A NaN in one token's row of x, or in one expert's weights: NaN exactly in the outputs of
  that token, or of the slots routed to that expert; every other output equals the gather
  oracle on clean inputs. Documented exception: `ragged` on CPUs and NVIDIA GPUs (seen on an
  H200), whose `ragged_dot` lowerings multiply every row by every expert and mask with zeros,
  spreads a weight NaN to the output column it sits in, for every token."""
  x, sel, w, _, _ = make_inputs(CASES[2])  # 64 tokens, k=4, 16 experts, only even ids used
  x, w, sel = np.array(x), np.array(w), np.asarray(sel)
  clean = np.asarray(cvmm(x, sel, w, impl="gather"))
  poisoned = np.zeros(sel.shape, bool)  # [N, k] slots whose outputs must be NaN
  if where == "token":
    x[5, 3] = np.nan
    poisoned[5] = True
  else:
    bad_expert = int(sel[9, 0])
    w[bad_expert, 0, 0] = np.nan
    poisoned |= sel == bad_expert
  got = np.asarray(jax.jit(lambda a, b: cvmm(a, sel, b, impl=impl))(x, w))  # [N, k, L]
  assert np.isnan(got[poisoned]).any(axis=-1).all()
  if impl == "ragged" and where == "expert" and jax.default_backend() in ("cpu", "gpu"):
    assert np.isnan(got[~poisoned][:, 0]).all()
    got, clean = got[..., 1:], clean[..., 1:]
  assert not np.isnan(got[~poisoned]).any()
  np.testing.assert_allclose(got[~poisoned], clean[~poisoned], rtol=1e-5, atol=1e-5)
