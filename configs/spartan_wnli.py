"""SPARTAN (or a baseline) on GLUE WNLI over a local Hugging Face RoBERTa.

  python train.py --config=configs/spartan_wnli.py --config.backbone.path=/path/to/roberta-base
  python train.py --config=configs/spartan_wnli.py:houlsby ...   # or pfeiffer, full, head
  python train.py --config=configs/spartan_wnli.py:spartan,fewshot ...   # 200 examples

3 epochs of the 635 training examples at batch 16 (App. A), max length 128.
"""

from configs import glue_common


def get_config(config_string: str | None = None):
  return glue_common.glue_config(config_string, "wnli", train_examples=635, epochs=3)
