"""CVMM with a grouped-matmul library: sort the slots, then `ragged_dot`.

The forward and input gradient are `ragged_dot` over the sorted rows (on the transposed
weights for the latter); the weight gradient is `ragged_dot_general` with the ragged
dimension contracted, which yields one [M, L] block per expert (zero for empty experts).
`library` is `jax.lax` (impl "ragged": XLA's op) or the `tokamax` package (impl "tokamax":
its Mosaic GPU / Triton kernels, which share `jax.lax`'s signatures). On CPU, XLA evaluates
`ragged_dot` as a dense matmul per group, and on NVIDIA GPUs its default lowering is a dense
dot over all groups, so "ragged" is a baseline, not a fast path.
"""

import importlib

import jax
import jax.numpy as jnp
from absl import flags
from jax import lax

from pallas_kernels import slot_layout
from pallas_kernels.blocked import full_precision

_WEIGHT_GRAD_DIMS = lax.RaggedDotDimensionNumbers(
    dot_dimension_numbers=(((0,), (0,)), ((), ())),
    lhs_ragged_dimensions=[0],
    rhs_group_dimensions=[],
)


def import_tokamax():
  """The `tokamax` package, or an ImportError saying how to get it.

  tokamax reads its options as absl flags and parses `sys.argv` on first use when nothing
  has parsed the flags yet, which fails under any other command line (pytest, a notebook's
  kernel); the flags then keep their defaults instead.
  """
  try:
    tokamax = importlib.import_module("tokamax")
  except ImportError as error:
    raise ImportError("impl='tokamax' needs the tokamax package: pip install tokamax "
                      "(see benchmarks/requirements-gpu.txt)") from error
  if not flags.FLAGS.is_parsed():
    flags.FLAGS.mark_as_parsed()
  return tokamax


def matmul(layout: slot_layout.SlotLayout, x_rm: jax.Array, w_eml: jax.Array, *,
           transpose: bool, out_dtype, library) -> jax.Array:
  """y[r] = x[r] @ w[e(r)] (or @ w[e(r)]^T when `transpose`) for expert-sorted rows."""
  w_emx = jnp.swapaxes(w_eml, 1, 2) if transpose else w_eml
  y_rx = library.ragged_dot(x_rm, w_emx, layout.groups.sizes_e,
                            precision=full_precision(x_rm.dtype),
                            preferred_element_type=jnp.float32)
  return y_rx.astype(out_dtype)


def weight_grad(layout: slot_layout.SlotLayout, x_rm: jax.Array, dy_rl: jax.Array, *,
                num_experts: int, out_dtype, library) -> jax.Array:
  """dw[e] = x_e^T @ dy_e over each expert's sorted rows."""
  del num_experts  # The number of groups is the length of sizes_e.
  dw_eml = library.ragged_dot_general(x_rm, dy_rl, layout.groups.sizes_e, _WEIGHT_GRAD_DIMS,
                                      precision=full_precision(x_rm.dtype),
                                      preferred_element_type=jnp.float32)
  return dw_eml.astype(out_dtype)
