"""The shared shape of the `spartan_<glue task>.py` configs (see `finetune_common`)."""

import math

from configs import finetune_common


def glue_config(config_string: str | None, task: str, *, train_examples: int, epochs: int):
  """`epochs` passes over `train_examples` at batch 16, sequences of at most 128 tokens."""
  return finetune_common.base_config(
      config_string,
      task={"name": f"glue/{task}", "download": True, "max_len": 128},
      backbone={"kind": "hf_roberta", "path": "pretrained/roberta-base"},
      steps=math.ceil(epochs * train_examples / 16))
