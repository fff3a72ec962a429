"""The embedded default (a sigma-MoE Transformer-XL on `builtin`) split over `mesh.tensor`.

    sparse-jax train --config=tensor_parallel --workdir=runs/tensor_parallel
    sparse-jax train --config=tensor_parallel:dense --workdir=runs/tensor_parallel_dense

Tensor parallelism 4 ways (Megatron-style, `sparse_jax.parallel`): each device holds one of
the 4 heads of every attention layer, a quarter of each expert's 128 hidden units (the dense
variant: of `d_ff` 1024), and a quarter of the 256-entry vocabulary; the rest of the devices
split the batch (`data=-1`: on 8 devices, data 2 x tensor 4). The same losses as on one device
up to float32 reduction order (tests/training/test_tensor_parallel.py). What may be split so
far, and what the config check refuses: docs/scaling_out.md.
"""

from sparse_jax.configs import default, default_dense

VARIANTS = ("sigma_moe", "dense")


def get_config(variant: str | None = None):
  variant = variant or "sigma_moe"
  if variant not in VARIANTS:
    raise ValueError(f"tensor_parallel.py:<variant> must be one of {VARIANTS}; got "
                     f"{variant!r}.")
  config = default.get_config() if variant == "sigma_moe" else default_dense.get_config()
  if variant == "dense":
    config.model.ff.d_ff = 1024  # The matched 1025 rounded to split evenly 4 ways.
  config.mesh.update(data=-1, tensor=4)
  return config
