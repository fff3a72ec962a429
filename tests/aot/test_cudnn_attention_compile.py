"""The causal kinds' fused attention core (`model.attention_core="cudnn"`, issue 60) compiled for
an H100 (sm_90) on CPU: the gradient of a bfloat16 LM ("causal" and "switchhead" attention,
rotary positions) through XLA's GPU compiler.

The compiled program must hold cuDNN's flash-attention custom calls, forward and backward,
and no floating-point tensor of B H T T elements (the scores and probabilities the XLA core
writes, which it does hold: checked too, so the search is not vacuous). cuDNN builds its
graph for the real device when the program first runs, so numerics and speed wait for a GPU.
"""

import math
import re

import jax
import jax.numpy as jnp
import pytest
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec as P

from sparse_jax.configs import default
from sparse_jax.aot import targets
from sparse_jax.models.lm import TransformerLM
from aot_testing import needs_gpu

# d_model is not T, so SwitchHead's [B T H, d_model] value rows do not have B H T T elements.
B, T, H, DH, D, V = 4, 256, 4, 64, 192, 512
_CUDNN_CALLS = ('custom_call_target="__cudnn$fmhaSoftmax"',
                'custom_call_target="__cudnn$fmhaSoftmaxBackward"')
_SWITCHHEAD = {"attention_experts": 4, "attention_k": 2}


def _model_config(attention: str, core: str, head_dim: int = DH):
  cfg = default.get_config().model
  cfg.update(d_model=D, n_layers=2, n_heads=H, head_dim=head_dim, vocab_size=V, mem_len=0,
             dropout=0.0, dtype="bfloat16", attention=attention, attention_core=core,
             **(_SWITCHHEAD if attention == "switchhead" else {}))
  cfg.ff.update(n_experts=4, expert_size=64, k=2, expert_dropout=0.0)
  return cfg


def _compile_grads(attention: str, core: str, head_dim: int = DH):
  """The compiled gradient of the LM's summed logits in its parameters, for one H100."""
  target = targets.parse_target("h100")
  mesh = targets.one_device_mesh(target)
  sharding = NamedSharding(mesh, P())
  graphdef, params, rest = nnx.split(
      TransformerLM(_model_config(attention, core, head_dim), rngs=nnx.Rngs(0)), nnx.Param, ...)

  def loss(params, rest, tokens_bt):
    logits_btv = nnx.merge(graphdef, params, rest)(tokens_bt)[0]
    return jnp.sum(logits_btv.astype(jnp.float32))

  abstract = lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding)
  args = (jax.tree.map(abstract, params), jax.tree.map(abstract, rest),
          jax.ShapeDtypeStruct((B, T), jnp.int32, sharding=sharding))
  with jax.set_mesh(mesh):
    lowered = jax.jit(jax.grad(loss)).trace(*args).lower(
        lowering_platforms=(target.lowering_platform,))
    return lowered.compile()


def _score_tensors(hlo: str) -> list[str]:
  """Floating-point tensor shapes of B H T T elements (scores, probabilities) in the HLO."""
  found = set()
  for dtype, dims in re.findall(r"\b(f32|bf16|f16)\[([\d,]+)\]", hlo):
    if math.prod(int(x) for x in dims.split(",")) == B * H * T * T:
      found.add(f"{dtype}[{dims}]")
  return sorted(found)


@needs_gpu
@pytest.mark.parametrize("attention, head_dim", [("causal", DH), ("switchhead", DH),
                                                 ("causal", 42)])  # 42: padded to 48
def test_the_cudnn_core_compiles_for_an_h100_without_scores_in_memory(attention, head_dim):
  hlo = _compile_grads(attention, "cudnn", head_dim).as_text()
  for call in _CUDNN_CALLS:
    assert call in hlo, f"{call} missing"
  assert not _score_tensors(hlo), _score_tensors(hlo)


@needs_gpu
def test_the_xla_core_holds_the_scores():
  """The search above finds the scores of the XLA core, which writes them."""
  hlo = _compile_grads("causal", "xla").as_text()
  assert _score_tensors(hlo)
  assert "__cudnn$fmha" not in hlo
