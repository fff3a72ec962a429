"""SPARTAN (or a baseline) on GLUE COLA over a local Hugging Face RoBERTa.

  python train.py --config=configs/spartan_cola.py --config.backbone.path=/path/to/roberta-base
  python train.py --config=configs/spartan_cola.py:houlsby ...   # or pfeiffer, full, head
  python train.py --config=configs/spartan_cola.py:spartan,fewshot ...   # 200 examples

20 epochs of the 8,551 training examples at batch 16 (App. A), max length 128.
"""

from configs import glue_common


def get_config(config_string: str | None = None):
  return glue_common.glue_config(config_string, "cola", train_examples=8551, epochs=20)
