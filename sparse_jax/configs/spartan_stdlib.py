"""SPARTAN on the offline task: which stdlib package a 256-byte snippet comes from.

The backbone is the byte LM that `sparse-jax train` (sparse_jax/configs/default.py) leaves in
`runs/default`, frozen; a SPARTAN memory after each of its layers and the head train.
  sparse-jax train                                                     # pretrain the backbone
  sparse-jax train --config=spartan_stdlib                  # SPARTAN
  sparse-jax train --config=spartan_stdlib:pfeiffer --workdir=runs/stdlib_pfeiffer
"""

from sparse_jax.configs import finetune_common


def get_config(config_string: str | None = None):
  return finetune_common.base_config(
      config_string, task={"name": "stdlib_packages", "max_len": 256},  # Whole snippets.
      backbone={"kind": "lm_checkpoint", "path": "runs/default"}, steps=600)
