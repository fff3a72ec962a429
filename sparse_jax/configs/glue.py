"""SPARTAN (or a baseline) on a GLUE task over a local Hugging Face RoBERTa.

  sparse-jax train --config=glue:rte --config.backbone.path=/path/to/roberta-base
  sparse-jax train --config=glue:rte,houlsby ...   # or pfeiffer, full, head
  sparse-jax train --config=glue:sst2,spartan,fewshot ...   # 200 examples

The config string is `<task>[,<method>][,fewshot|fewshot_script]`: a task of `TASKS`, then
the method and the few-shot setting as `finetune_common` reads them (the method defaults to
spartan). Each task trains its epochs over its training examples at batch 16 (App. A),
sequences of at most 128 tokens.
"""

import math

from sparse_jax.configs import finetune_common

# task: (training examples, epochs) (SPARTAN App. A: 20 epochs, 3 on the largest and WNLI).
TASKS = {
    "cola": (8551, 20),
    "mnli": (392_702, 3),
    "mrpc": (3668, 20),
    "qnli": (104_743, 20),
    "qqp": (363_846, 3),
    "rte": (2490, 20),
    "sst2": (67_349, 3),
    "stsb": (5749, 20),
    "wnli": (635, 3),
}
BATCH_SIZE = 16


def get_config(config_string: str | None = None):
  task, _, method = (config_string or "").partition(",")
  if task not in TASKS:
    raise ValueError(f"glue.py:<task>[,<method>][,fewshot|fewshot_script]: task must be one "
                     f"of {sorted(TASKS)}; got {task!r} (config string {config_string!r}).")
  train_examples, epochs = TASKS[task]
  return finetune_common.base_config(
      method, task={"name": f"glue/{task}", "max_len": 128},
      backbone={"kind": "hf_roberta", "path": "pretrained/roberta-base"},
      steps=math.ceil(epochs * train_examples / BATCH_SIZE), batch_size=BATCH_SIZE)
