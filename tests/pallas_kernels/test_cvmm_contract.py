"""cvmm's contract at its edges: the impl `auto` picks, and errors naming the bad argument.

(Values and gradients of every impl: test_cvmm_numerics.py.)
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pallas_kernels import cvmm
from cvmm_testing import CASES, make_inputs


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
