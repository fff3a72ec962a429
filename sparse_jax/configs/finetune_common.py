"""Shared sections of the fine-tuning configs (`glue.py`, `spartan_stdlib.py`): SPARTAN App. A.

`method` is chosen by the config string: `--config=glue:rte,houlsby` (one of
`finetune.methods.METHODS`), optionally with `,fewshot` (SPARTAN App. B: 200 training
examples, drawn by the seed, 1000 steps) or `,fewshot_script` (the reference's few-shot script:
the first 200 examples, 3 epochs). The learning rate follows the method
(`finetune.methods.LEARNING_RATES`, App. A); the schedule is the Hugging Face Trainer's default
that the reference runs: no warmup, linear decay to 0 (`--config.train.schedule=cosine
--config.train.warmup_steps=N` gives warmup then cosine decay instead). Fields left to their
schemas' defaults are set the same way: `--config.backbone.dtype=bfloat16` (the compute dtype
while fine-tuning; None: the backbone's), `--config.backbone.step=N` (None: the latest
checkpoint), `--config.task.data_dir=DIR`, `--config.method.spartan.n_parents=32`,
`--config.eval.max_examples=N` (None: the whole validation split).
"""

import math

import ml_collections

from sparse_jax.finetune.methods import LEARNING_RATES, METHODS, default_method_config

FEW_SHOT_EXAMPLES, FEW_SHOT_STEPS, FEW_SHOT_SCRIPT_EPOCHS = 200, 1000, 3
FEW_SHOT = ("fewshot", "fewshot_script")


def parse(config_string: str | None) -> tuple[str, str | None]:
  """`"houlsby,fewshot"` -> `("houlsby", "fewshot")`; empty -> `("spartan", None)`."""
  parts = [p for p in (config_string or "").split(",") if p]
  few_shot = [p for p in parts if p in FEW_SHOT]
  methods = [p for p in parts if p not in FEW_SHOT]
  if len(methods) > 1 or len(few_shot) > 1 or (methods and methods[0] not in METHODS):
    raise ValueError(f"config string {config_string!r}: expected one of "
                     f"{sorted(METHODS)}, optionally followed by one of ',fewshot' or "
                     "',fewshot_script'.")
  return (methods[0] if methods else "spartan"), (few_shot[0] if few_shot else None)


def method_section(kind: str) -> ml_collections.ConfigDict:
  """The `method` section of `kind`: the settings its reference code gives the schema's None
  fields (`default_method_config`: whether the backbone's LayerNorms train, AdapterHub's
  adapter activation and LayerNorm placement), and an empty `spartan` section for overrides."""
  reference = default_method_config(kind)
  return ml_collections.ConfigDict({
      "kind": kind, "train_layer_norms": reference.train_layer_norms, "spartan": {},
      "adapter": {"activation": reference.adapter.activation,
                  "original_ln_before": reference.adapter.original_ln_before}})


def base_config(config_string: str | None, *, task: dict, backbone: dict, steps: int,
                batch_size: int = 16) -> ml_collections.ConfigDict:
  method, few_shot = parse(config_string)
  config = ml_collections.ConfigDict()
  config.seed = 0  # The schema's default; `tasks.backbones.build_classifier` reads it.
  config.task = ml_collections.ConfigDict(task)
  config.backbone = ml_collections.ConfigDict(backbone)
  config.method = method_section(method)
  if few_shot == "fewshot":
    steps = FEW_SHOT_STEPS
  elif few_shot == "fewshot_script":
    steps = math.ceil(FEW_SHOT_SCRIPT_EPOCHS * FEW_SHOT_EXAMPLES / batch_size)
  config.train = ml_collections.ConfigDict({
      "steps": steps, "lr": LEARNING_RATES[method], "schedule": "linear", "grad_clip": 1.0,
      "batch_size": batch_size, "log_every": 20, "eval_every": 500, "ckpt_every": 500})
  if few_shot:
    config.task.n_train = FEW_SHOT_EXAMPLES
    if few_shot == "fewshot_script":
      config.task.n_train_from = "first"
  config.eval = ml_collections.ConfigDict({"batch_size": 64})
  # The (data, fsdp, expert) device mesh, as for language models (docs/scaling_out.md).
  config.mesh = ml_collections.ConfigDict({"data": -1})
  return config
