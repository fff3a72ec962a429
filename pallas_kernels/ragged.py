"""CVMM with XLA's grouped matmul: sort the slots, then `jax.lax.ragged_dot`.

The forward and input gradient are `ragged_dot` over the sorted rows (on the transposed
weights for the latter); the weight gradient is `ragged_dot_general` with the ragged
dimension contracted, which yields one [M, L] block per expert (zero for empty experts).
On CPU, XLA evaluates `ragged_dot` as a dense matmul per group, so this impl is a GPU/TPU
baseline, not a CPU path.
"""

import jax
import jax.numpy as jnp
from jax import lax

from pallas_kernels import dispatch

_WEIGHT_GRAD_DIMS = lax.RaggedDotDimensionNumbers(
    dot_dimension_numbers=(((0,), (0,)), ((), ())),
    lhs_ragged_dimensions=[0],
    rhs_group_dimensions=[],
)


def matmul(layout: dispatch.SlotLayout, x_rm: jax.Array, w_eml: jax.Array, *,
           transpose: bool, out_dtype) -> jax.Array:
  """y[r] = x[r] @ w[e(r)] (or @ w[e(r)]^T when `transpose`) for expert-sorted rows."""
  w_emx = jnp.swapaxes(w_eml, 1, 2) if transpose else w_eml
  y_rx = lax.ragged_dot(x_rm, w_emx, layout.groups.sizes_e, preferred_element_type=jnp.float32)
  return y_rx.astype(out_dtype)


def weight_grad(layout: dispatch.SlotLayout, x_rm: jax.Array, dy_rl: jax.Array, *,
                num_experts: int, out_dtype) -> jax.Array:
  """dw[e] = x_e^T @ dy_e over each expert's sorted rows."""
  del num_experts  # The number of groups is the length of sizes_e.
  dw_eml = lax.ragged_dot_general(x_rm, dy_rl, layout.groups.sizes_e, _WEIGHT_GRAD_DIMS,
                                  preferred_element_type=jnp.float32)
  return dw_eml.astype(out_dtype)
