"""Shared sections of the fine-tuning configs (`spartan_*.py`): SPARTAN App. A settings.

`method` is chosen by the config string: `--config=configs/spartan_rte.py:houlsby` (one of
`finetune.methods.METHODS`), optionally with `,fewshot` (SPARTAN App. B: 200 training
examples, 1000 steps). The learning rate follows the method
(`finetune.methods.LEARNING_RATES`, App. A).
"""

import ml_collections
from ml_collections import config_dict

from sparse_jax.finetune.methods import LEARNING_RATES, METHODS, default_method_config

FEW_SHOT_EXAMPLES, FEW_SHOT_STEPS = 200, 1000


def parse(config_string: str | None) -> tuple[str, bool]:
  """`"houlsby,fewshot"` -> `("houlsby", True)`; empty -> `("spartan", False)`."""
  parts = [p for p in (config_string or "").split(",") if p]
  few_shot = "fewshot" in parts
  methods = [p for p in parts if p != "fewshot"]
  if len(methods) > 1 or (methods and methods[0] not in METHODS):
    raise ValueError(f"config string {config_string!r}: expected one of "
                     f"{sorted(METHODS)}, optionally followed by ',fewshot'.")
  return (methods[0] if methods else "spartan"), few_shot


def base_config(config_string: str | None, *, task: dict, backbone: dict, steps: int,
                batch_size: int = 16) -> ml_collections.ConfigDict:
  method, few_shot = parse(config_string)
  config = ml_collections.ConfigDict()
  config.seed = 0
  config.task = ml_collections.ConfigDict({
      "data_dir": config_dict.placeholder(str), "n_train": config_dict.placeholder(int),
      **task})
  config.backbone = ml_collections.ConfigDict(
      {"step": config_dict.placeholder(int), **backbone})
  config.method = default_method_config(method)
  config.train = ml_collections.ConfigDict({
      "steps": FEW_SHOT_STEPS if few_shot else steps, "lr": LEARNING_RATES[method],
      "grad_clip": 1.0, "batch_size": batch_size, "log_every": 20, "eval_every": 500,
      "ckpt_every": 500, "keep_checkpoints": 2})
  # 6% of the steps, rounded up; a reference, so it follows --config.train.steps.
  config.train.warmup_steps = (config.train.get_ref("steps") * 6 + 99) // 100
  if few_shot:
    config.task.n_train = FEW_SHOT_EXAMPLES
  config.eval = ml_collections.ConfigDict(
      {"batch_size": 64, "max_examples": config_dict.placeholder(int)})
  # The (data, fsdp, expert) device mesh, as for language models (README "Scaling out").
  config.mesh = ml_collections.ConfigDict({"data": -1, "fsdp": 1, "expert": 1})
  return config
