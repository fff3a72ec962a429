"""Shared sections of the fine-tuning configs (`spartan_*.py`): SPARTAN App. A settings.

`method` is chosen by the config string: `--config=configs/spartan_rte.py:houlsby` (one of
`freezing.METHODS`), optionally with `,fewshot` (SPARTAN App. B: 200 training examples, 1000
steps). The learning rate follows the method (App. A: SPARTAN 1e-3, adapters 1e-4, full 2e-5).
"""

import math

import ml_collections
from ml_collections import config_dict

from sparse_jax.finetune.methods import default_method_config

LEARNING_RATES = {"spartan": 1e-3, "houlsby": 1e-4, "pfeiffer": 1e-4, "full": 2e-5, "head": 1e-3}
FEW_SHOT_EXAMPLES, FEW_SHOT_STEPS = 200, 1000


def parse(config_string: str | None) -> tuple[str, bool]:
  """`"houlsby,fewshot"` -> `("houlsby", True)`; empty -> `("spartan", False)`."""
  parts = [p for p in (config_string or "").split(",") if p]
  few_shot = "fewshot" in parts
  methods = [p for p in parts if p != "fewshot"]
  if len(methods) > 1 or (methods and methods[0] not in LEARNING_RATES):
    raise ValueError(f"config string {config_string!r}: expected one of "
                     f"{sorted(LEARNING_RATES)}, optionally followed by ',fewshot'.")
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
      "steps": steps, "lr": LEARNING_RATES[method], "warmup_steps": 0, "grad_clip": 1.0,
      "batch_size": batch_size, "log_every": 20, "eval_every": 500, "ckpt_every": 500,
      "keep_checkpoints": 2})
  config.train.warmup_steps = math.ceil(0.06 * config.train.steps)
  if few_shot:
    config.task.n_train = FEW_SHOT_EXAMPLES
    config.train.steps = FEW_SHOT_STEPS
    config.train.warmup_steps = math.ceil(0.06 * FEW_SHOT_STEPS)
  config.eval = ml_collections.ConfigDict(
      {"batch_size": 64, "max_examples": config_dict.placeholder(int)})
  # The (data, fsdp, expert) device mesh, as for language models (README "Scaling out").
  config.mesh = ml_collections.ConfigDict({"data": -1, "fsdp": 1, "expert": 1})
  return config
