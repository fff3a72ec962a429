"""Feed-forward layers called with the wrong width: an error naming the expected and the given
shape, never a silent reshape. (Before, the MoE kinds, PKM and SPARTAN reshaped `x` to
`[-1, d_model]`, so `[2, 3, 8]` into a d_model=16 layer ran on 3 made-up rows of 16.)"""

import sys
import os

import jax.numpy as jnp
import pytest
from flax import nnx

from sparse_jax.layers import registry
from sparse_jax.layers.spartan import SpartanMemory

sys.path.append(os.path.join(os.path.dirname(os.path.dirname(__file__)), "models"))
from test_ff_kinds_in_lm import FF_CONFIGS  # noqa: E402

D_MODEL = 16


def _layers():
  layers = {kind: registry.build_ff(registry.parse_ff({"kind": kind, **fields}),
                                    d_model=D_MODEL, n_layers=2, rngs=nnx.Rngs(0))
            for kind, fields in FF_CONFIGS.items()}
  layers["spartan_memory"] = SpartanMemory(D_MODEL, 4, 2, 2, rngs=nnx.Rngs(0))
  return layers


LAYERS = _layers()


@pytest.mark.parametrize("shape", [(2, 3, 8), (2, 3, 17), (5, 32)])
@pytest.mark.parametrize("kind", sorted(LAYERS))
def test_a_wrong_width_is_an_error_naming_the_shapes(kind, shape):
  """Our check (ValueError) in the layers that flatten tokens; JAX's own contraction error
  (TypeError, naming both widths) in those whose first op is a matmul over the last axis."""
  with pytest.raises((ValueError, TypeError)) as raised:
    LAYERS[kind](jnp.ones(shape))
  message = str(raised.value)
  assert str(D_MODEL) in message and str(shape[-1]) in message, message


@pytest.mark.parametrize("kind", sorted(LAYERS))
def test_the_right_width_keeps_the_leading_shape(kind):
  y = LAYERS[kind](jnp.ones((2, 3, D_MODEL)))
  y = y[0] if isinstance(y, tuple) else y
  assert y.shape == (2, 3, D_MODEL)
