"""SPARTAN on the offline task: which stdlib package a 256-byte snippet comes from.

The backbone is the byte LM that `python train.py` (configs/default.py) leaves in
`runs/default`, frozen; a SPARTAN memory after each of its layers and the head train.
  python train.py                                                     # pretrain the backbone
  python train.py --config=configs/spartan_stdlib.py                  # SPARTAN
  python train.py --config=configs/spartan_stdlib.py:pfeiffer --workdir=runs/stdlib_pfeiffer
"""

from sparse_jax.configs import finetune_common


def get_config(config_string: str | None = None):
  return finetune_common.base_config(
      config_string, task={"name": "stdlib_packages", "max_len": 256},  # Whole snippets.
      backbone={"kind": "lm_checkpoint", "path": "runs/default"}, steps=600)
