"""SPARTAN (or a baseline) on GLUE STSB over a local Hugging Face RoBERTa.

  python train.py --config=configs/spartan_stsb.py --config.backbone.path=/path/to/roberta-base
  python train.py --config=configs/spartan_stsb.py:houlsby ...   # or pfeiffer, full, head
  python train.py --config=configs/spartan_stsb.py:spartan,fewshot ...   # 200 examples

20 epochs of the 5,749 training examples at batch 16 (App. A), max length 128.
"""

from configs import glue_common


def get_config(config_string: str | None = None):
  return glue_common.glue_config(config_string, "stsb", train_examples=5749, epochs=20)
