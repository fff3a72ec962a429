"""SPARTAN (or a baseline) on GLUE QNLI over a local Hugging Face RoBERTa.

  python train.py --config=configs/spartan_qnli.py --config.backbone.path=/path/to/roberta-base
  python train.py --config=configs/spartan_qnli.py:houlsby ...   # or pfeiffer, full, head
  python train.py --config=configs/spartan_qnli.py:spartan,fewshot ...   # 200 examples

20 epochs of the 104,743 training examples at batch 16 (App. A), max length 128.
"""

from configs import glue_common


def get_config(config_string: str | None = None):
  return glue_common.glue_config(config_string, "qnli", train_examples=104743, epochs=20)
