"""The embedded default (a sigma-MoE Transformer-XL on `builtin`) split over `mesh.tensor`.

    sparse-jax train --config=tensor_parallel --workdir=runs/tensor_parallel
    sparse-jax train --config=tensor_parallel:dense --workdir=runs/tensor_parallel_dense
    sparse-jax train --config=tensor_parallel:sparse_ff_qkv --workdir=runs/tensor_parallel_sparse

Tensor parallelism 4 ways (Megatron-style, `sparse_jax.parallel`): each device holds one of
the 4 heads of every attention layer, a quarter of each expert's 128 hidden units (the dense
variant: of `d_ff` 1024), and a quarter of the 256-entry vocabulary; the rest of the devices
split the batch (`data=-1`: on 8 devices, data 2 x tensor 4). The same losses as on one device
up to float32 reduction order (tests/training/test_tensor_parallel.py). What may be split so
far, and what the config check refuses: docs/scaling_out.md.

`sparse_ff_qkv` is Scaling Transformers' small LM (`scaling_small:ff_qkv`: sparse FF, sparse
QKV attention) split the same way: each device holds 2 of the 8 modules and heads, and a
quarter of the sparse FF's blocks of 32 units, its `d_ff` rounded down from the matched
1344 (42 blocks) to 1280 (40 blocks) so that whole blocks split 4 ways.
"""

from sparse_jax.configs import default, default_dense, scaling_small

VARIANTS = ("sigma_moe", "dense", "sparse_ff_qkv")
TENSOR = 4


def get_config(variant: str | None = None):
  variant = variant or "sigma_moe"
  if variant not in VARIANTS:
    raise ValueError(f"tensor_parallel.py:<variant> must be one of {VARIANTS}; got "
                     f"{variant!r}.")
  if variant == "sparse_ff_qkv":
    config = scaling_small.get_config("ff_qkv")
    whole_blocks = TENSOR * config.model.ff.block_size
    config.model.ff.d_ff -= config.model.ff.d_ff % whole_blocks
  elif variant == "dense":
    config = default_dense.get_config()
    config.model.ff.d_ff = 1024  # The matched 1025 rounded to split evenly 4 ways.
  else:
    config = default.get_config()
  config.mesh.update(data=-1, tensor=TENSOR)
  return config
