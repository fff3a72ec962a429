"""Mixed precision: matmuls whose result must be float32 (scores, logits) on bfloat16 operands.

The models compute in `model.dtype`: activations in it, float32 parameters cast to it where a
matmul reads them, XLA accumulating in float32 inside each matmul. Where the result feeds a
softmax, a sigmoid, a top-k or the loss, it is wanted in float32 as well:
`einsum(..., preferred_element_type=float32)`. Differentiated as is, that matmul's backward
takes the float32 cotangent and promotes the bfloat16 operand to float32, so the backward of
every score matmul would run at float32's rate (seen in the lowered training step). `f32_einsum`
keeps the float32 result and runs the backward in the operands' dtype.
"""

import functools

import jax
import jax.numpy as jnp

# `model.dtype`: the compute dtype of activations and matmul operands (parameters and
# optimiser state stay float32).
COMPUTE_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}


def f32_einsum(spec: str, a: jax.Array, b: jax.Array) -> jax.Array:
  """`einsum(spec, a, b)` with a float32 (at least) result. Operands of 32 bits or more: the
  plain einsum. Narrower (bfloat16): float32 accumulation and result, and a backward whose
  matmuls take the cotangent cast to the operands' dtype."""
  dtype = jnp.result_type(a, b)
  if jnp.dtype(dtype).itemsize >= 4:
    return jnp.einsum(spec, a, b, preferred_element_type=jnp.promote_types(dtype, jnp.float32))
  return _narrow_f32_einsum(spec, a.astype(dtype), b.astype(dtype))


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _narrow_f32_einsum(spec, a, b):
  return jnp.einsum(spec, a, b, preferred_element_type=jnp.float32)


def _forward(spec, a, b):
  return _narrow_f32_einsum(spec, a, b), (a, b)


def _backward(spec, operands, g):
  a, b = operands
  _, pullback = jax.vjp(lambda a, b: jnp.einsum(spec, a, b), a, b)
  return pullback(g.astype(a.dtype))


_narrow_f32_einsum.defvjp(_forward, _backward)
