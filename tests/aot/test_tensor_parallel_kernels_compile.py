"""Our GPU kernels under tensor parallelism, compiled for two H100s on CPU (XLA's GPU compiler,
Triton, ptxas): the training step of a small sigma-MoE LM with the Triton expert kernels
(`model.ff.impl=pallas`) and the fused XL attention (`model.attention_impl=pallas`) on
`mesh.tensor=2`, as `train.py --compile_only=h100:2` compiles it.

Both run inside `shard_map`s on each device's slice (`layers.expert_parallel`,
`layers.xl_attention.fused_per_device`), so the compiled step must hold the kernels and no
all-gather at all (none of a weight split over `tensor`: an expert's columns, an attention
projection's heads), only all-reduces, among them Megatron's of the activations: per layer
the experts' partial outputs (`B T x d`) forward and their input gradient backward, and the
attention output projection's partial sums forward.
"""

import collections

from lm_testing import tiny_lm_config

from aot_testing import needs_gpu
from sparse_jax.aot import targets
from sparse_jax.aot.collectives import collectives
from sparse_jax.tasks import task_for
from sparse_jax.training.compile_only import compile_task

_KERNELS = ("cvmm_segment_matmul", "cvmm_weight_grad", "xl_attention_forward",
            "xl_attention_dkdv", "xl_attention_dq")


@needs_gpu
def test_the_kernels_split_over_tensor_compile_with_all_reduces_only(tmp_path):
  config = tiny_lm_config(str(tmp_path), str(tmp_path / "tfds"))
  config.model.update(n_heads=4, attention_impl="pallas", attn_dropout=0.0)
  config.model.ff.impl = "pallas"
  config.mesh.tensor = 2
  hlo = compile_task(task_for(config), targets.parse_target("h100:2")).train.as_text()
  assert all(kernel in hlo for kernel in _KERNELS), [k for k in _KERNELS if k not in hlo]
  found = collectives(hlo)
  assert {c.kind for c in found} == {"all-reduce"}, found
  counts = collections.Counter((c.shape, c.backward) for c in found)
  batch, seq = config.data.batch_size, config.data.seq_len
  d, n_layers = config.model.d_model, config.model.n_layers
  assert counts[(batch * seq, d), False] == counts[(batch * seq, d), True] == n_layers
  assert counts[(batch, seq, d), False] >= n_layers
