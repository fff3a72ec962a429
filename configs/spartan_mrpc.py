"""SPARTAN (or a baseline) on GLUE MRPC over a local Hugging Face RoBERTa.

  python train.py --config=configs/spartan_mrpc.py --config.backbone.path=/path/to/roberta-base
  python train.py --config=configs/spartan_mrpc.py:houlsby ...   # or pfeiffer, full, head
  python train.py --config=configs/spartan_mrpc.py:spartan,fewshot ...   # 200 examples

20 epochs of the 3,668 training examples at batch 16 (App. A), max length 128.
"""

from configs import glue_common


def get_config(config_string: str | None = None):
  return glue_common.glue_config(config_string, "mrpc", train_examples=3668, epochs=20)
