"""sigma-MoE WT-103 B (262M, Table 7) at the paper's batch of 64 on one 80 GB GPU.

    sparse-jax train --config=wt103_b_one_gpu            # bf16, remat "dots"
    sparse-jax train --config=wt103_b_one_gpu:accumulate # bf16, 2 micro-batches
    sparse-jax train --config=wt103_b_one_gpu --compile_only=h100   # check first

`sparse_jax/configs/sigma_moe_paper.py:wt103_b` as written needs 120 GiB per device for its training
step (float32, everything stored), so it does not fit an H100. Compiled for an H100
(`benchmarks/train_memory.py`, benchmarks/RESULTS.md): bfloat16 compute alone 82 GiB; with
`model.remat="dots"` 20 GiB (recomputing attention and activations, keeping the weight
matmuls' outputs); with `train.grad_accum_steps=2` instead 47 GiB (the same update up to the
regulariser's per-micro-batch batch statistics, docs/training.md "Gradient accumulation").
"""

from sparse_jax.configs import sigma_moe_paper

VARIANTS = ("remat", "accumulate")


def get_config(variant: str | None = None):
  variant = variant or "remat"
  if variant not in VARIANTS:
    raise ValueError(f"wt103_b_one_gpu.py:<variant> must be one of {VARIANTS}; got {variant!r}.")
  config = sigma_moe_paper.get_config("wt103_b")
  config.model.dtype = "bfloat16"
  if variant == "remat":
    config.model.remat = "dots"
  else:
    config.train.grad_accum_steps = 2
  return config
