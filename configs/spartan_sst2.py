"""SPARTAN (or a baseline) on GLUE SST2 over a local Hugging Face RoBERTa.

  python train.py --config=configs/spartan_sst2.py --config.backbone.path=/path/to/roberta-base
  python train.py --config=configs/spartan_sst2.py:houlsby ...   # or pfeiffer, full, head
  python train.py --config=configs/spartan_sst2.py:spartan,fewshot ...   # 200 examples

3 epochs of the 67,349 training examples at batch 16 (App. A), max length 128.
"""

from configs import glue_common


def get_config(config_string: str | None = None):
  return glue_common.glue_config(config_string, "sst2", train_examples=67349, epochs=3)
