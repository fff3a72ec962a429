"""SPARTAN (or a baseline) on GLUE MNLI over a local Hugging Face RoBERTa.

  python train.py --config=configs/spartan_mnli.py --config.backbone.path=/path/to/roberta-base
  python train.py --config=configs/spartan_mnli.py:houlsby ...   # or pfeiffer, full, head
  python train.py --config=configs/spartan_mnli.py:spartan,fewshot ...   # 200 examples

3 epochs of the 392,702 training examples at batch 16 (App. A), max length 128.
"""

from configs import glue_common


def get_config(config_string: str | None = None):
  return glue_common.glue_config(config_string, "mnli", train_examples=392702, epochs=3)
