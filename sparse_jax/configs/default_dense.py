"""The dense twin of `sparse_jax/configs/default.py`: the same model with the matched dense FF."""

from sparse_jax.configs import default
from sparse_jax.models.accounting import matched_dense_config


def get_config():
  return matched_dense_config(default.get_config())
