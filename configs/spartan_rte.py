"""SPARTAN (or a baseline) on GLUE RTE over a local Hugging Face RoBERTa.

  python train.py --config=configs/spartan_rte.py --config.backbone.path=/path/to/roberta-base
  python train.py --config=configs/spartan_rte.py:houlsby ...   # or pfeiffer, full, head
  python train.py --config=configs/spartan_rte.py:spartan,fewshot ...   # 200 examples

20 epochs of the 2,490 training examples at batch 16 (App. A), max length 128.
"""

from configs import glue_common


def get_config(config_string: str | None = None):
  return glue_common.glue_config(config_string, "rte", train_examples=2490, epochs=20)
