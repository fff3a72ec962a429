"""The fused causal attention core (issue 60): cuDNN's flash attention, whose scores never
reach memory, for the causal kinds ("causal", "switchhead": MoEUT's and SwitchHead's RoPE
attention).

    out = softmax(q k^T / sqrt(Dh) + causal mask) v        (Vaswani et al. 2017, Eq. 1)

per head, on q, k, v `[B, T, H, Dh]`: the function `causal_attention.attend` computes with
the float32 `[B, H, T, T]` scores in memory (written forward, read again backward). Here it is
one `jax.nn.dot_product_attention(..., is_causal=True, implementation="cudnn")` call: XLA's
`__cudnn$fmhaSoftmax` custom call forward and `__cudnn$fmhaSoftmaxBackward` backward, both
flash attention (scores in registers and shared memory, a float32 log-sum-exp per query
kept for the backward). Rotary positions rotate q and k before the call, so they compose.

cuDNN's conditions, checked here: bfloat16 or float16 q, k, v (`model.dtype="bfloat16"`), a
head dim that is a multiple of 8 and at most 128, and no attention dropout (the public API
has none). Other head dims up to 128 get zero channels up to the next multiple of 8 (the
MoEUT paper's 41 and 82 -> 48 and 88) and the scale of their own width, 1/sqrt(Dh): the
zeros add nothing to q . k, and the output's extra channels, zero, are dropped.

`model.attention_core` (`CORES`) picks the core of the causal kinds: "xla" the scores in
memory, "cudnn" this call, "auto" the XLA path until the cuDNN path has run on a GPU (its
numerics cannot be checked on a CPU; the XL kinds pick their core with
`model.attention_impl`). Decoding keeps the KV cache path either way: one query row per step
has no `[T, T]` scores.
"""

import math

import jax
import jax.numpy as jnp

CORES = ("auto", "xla", "cudnn")
CUDNN_DTYPES = ("bfloat16", "float16")
CUDNN_HEAD_DIM_MULTIPLE = 8
CUDNN_MAX_HEAD_DIM = 128


def cudnn_head_width(head_dim: int) -> int:
  """The width heads of `head_dim` channels reach cuDNN with: the next multiple of 8."""
  return -(-head_dim // CUDNN_HEAD_DIM_MULTIPLE) * CUDNN_HEAD_DIM_MULTIPLE


def cudnn_head_dim_ok(head_dim: int) -> bool:
  """Whether heads of `head_dim` channels, padded to `cudnn_head_width`, fit cuDNN's fused
  attention (at most 128 on every GPU: Hopper with cuDNN >= 9.5 also takes 256, which this
  does not rely on)."""
  return cudnn_head_width(head_dim) <= CUDNN_MAX_HEAD_DIM


def check_core(core: str, head_dim: int, attn_dropout: float) -> None:
  """A ValueError naming `attention_core` unless `core` is one of `CORES` and, for "cudnn",
  the head dim and dropout rate are ones cuDNN's fused attention runs."""
  if core not in CORES:
    raise ValueError(f"attention_core must be one of {CORES}, got {core!r}")
  if core != "cudnn":
    return
  if not cudnn_head_dim_ok(head_dim):
    raise ValueError(f"attention_core='cudnn' needs a head dim of at most "
                     f"{CUDNN_MAX_HEAD_DIM}, got {head_dim}; use attention_core='xla'")
  if attn_dropout > 0:
    raise ValueError(f"attention_core='cudnn' has no attention dropout: set attn_dropout=0 "
                     f"(got {attn_dropout}) or attention_core='xla'")


def attend_cudnn(q_bthc: jax.Array, k_bthc: jax.Array, v_bthc: jax.Array,
                 implementation: str = "cudnn") -> jax.Array:
  """Causal `softmax(q k^T / sqrt(Dh)) v`, `[B, T, H, Dh]` in q's dtype, by cuDNN's fused
  kernels (a ValueError for a dtype they do not take), heads padded to `cudnn_head_width`
  (module docstring). `implementation="xla"` runs JAX's XLA version of the same call
  instead: the CPU tests' stand-in for the GPU-only kernels."""
  if implementation == "cudnn" and q_bthc.dtype.name not in CUDNN_DTYPES:
    raise ValueError(f"attention_core='cudnn' needs q, k, v in one of {CUDNN_DTYPES} "
                     f"(model.dtype='bfloat16'), got {q_bthc.dtype.name}")
  head_dim = q_bthc.shape[-1]
  width = cudnn_head_width(head_dim)
  pad = lambda x: jnp.pad(x, ((0, 0),) * 3 + ((0, width - head_dim),))
  out_bthc = jax.nn.dot_product_attention(pad(q_bthc), pad(k_bthc), pad(v_bthc),
                                          scale=1 / math.sqrt(head_dim), is_causal=True,
                                          implementation=implementation)
  return out_bthc[..., :head_dim]
