"""SPARTAN (or a baseline) on GLUE QQP over a local Hugging Face RoBERTa.

  python train.py --config=configs/spartan_qqp.py --config.backbone.path=/path/to/roberta-base
  python train.py --config=configs/spartan_qqp.py:houlsby ...   # or pfeiffer, full, head
  python train.py --config=configs/spartan_qqp.py:spartan,fewshot ...   # 200 examples

3 epochs of the 363,846 training examples at batch 16 (App. A), max length 128.
"""

from configs import glue_common


def get_config(config_string: str | None = None):
  return glue_common.glue_config(config_string, "qqp", train_examples=363846, epochs=3)
