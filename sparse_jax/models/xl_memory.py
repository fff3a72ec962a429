"""Transformer-XL segment memory: each layer's inputs from previous segments."""

import flax.struct
import jax
import jax.numpy as jnp


@flax.struct.dataclass
class XLMemory:
  """The recurrent state of a `TransformerLM` between segments.

  Attributes:
    hidden_lbmd: `[n_layers, B, M, d_model]`, the stop-gradient inputs of every layer over
      the last M positions, oldest first.
    valid: int32 scalar, how many of the last M positions hold real tokens (0 at the start of
      a stream, so an empty memory is never attended to).
  """

  hidden_lbmd: jax.Array
  valid: jax.Array

  @classmethod
  def empty(cls, n_layers: int, batch: int, mem_len: int, d_model: int,
            dtype=jnp.float32) -> "XLMemory":
    return cls(jnp.zeros((n_layers, batch, mem_len, d_model), dtype), jnp.zeros((), jnp.int32))

  @property
  def mem_len(self) -> int:
    return self.hidden_lbmd.shape[2]

  def append(self, inputs_lbtd: jax.Array) -> "XLMemory":
    """Keeps the last M positions of `[memory; inputs]`, with gradients stopped."""
    m, t = self.mem_len, inputs_lbtd.shape[2]
    joined = jnp.concatenate([self.hidden_lbmd, inputs_lbtd.astype(self.hidden_lbmd.dtype)], 2)
    return XLMemory(jax.lax.stop_gradient(joined[:, :, joined.shape[2] - m:]),
                    jnp.minimum(self.valid + t, m).astype(jnp.int32))
