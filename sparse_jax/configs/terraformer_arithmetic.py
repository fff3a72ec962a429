"""Length generalisation (Scaling Transformers Table 4): copy or add, train on up to 128 digits.

    sparse-jax train --config=terraformer_arithmetic:copy --workdir=runs/copy
    sparse-jax train --config=terraformer_arithmetic:add,transformer
    sparse-jax eval --workdir=runs/copy --split=test          # 256-300 digits

The config string is the task (`copy` or `add`), optionally followed by `,transformer`: the
same encoder-decoder without Terraformer's parts (dense attention, dense FF, no SRU branch,
not reversible, and the sinusoidal positions of Trax's `Transformer`), the paper's
comparison. Sizes are small enough for a 2-core CPU (`benchmarks/length_generalization.py`
runs all four); the Terraformer's LSH uses chunks of 32 with 16 buckets, its FF is sparse
(blocks of 16) with the 32-unit SRU branch. The Terraformer takes Trax's details, the model
schema's defaults: fixed-base positions with random start offsets in training (what Trax's
`terraformer_copy.gin` sets), dropout masks shared along the length, the uniform embedding
init, attention biases; training adds Trax's weight decay (`w <- (1 - 1e-5) w` every step,
its Adam's default). `--config.model.positions=sinusoid` is the ablation without them.
"""

import ml_collections

TASKS = ("copy", "add")


def parse(config_string: str | None) -> tuple[str, bool]:
  """`"add,transformer"` -> `("add", True)`; empty -> `("copy", False)`."""
  parts = [p for p in (config_string or "copy").split(",") if p]
  if not parts or parts[0] not in TASKS or parts[1:] not in ([], ["transformer"]):
    raise ValueError(f"config string {config_string!r}: expected one of {TASKS}, optionally "
                     "followed by ',transformer'.")
  return parts[0], parts[1:] == ["transformer"]


def model_config(transformer: bool) -> ml_collections.ConfigDict:
  """A 2+2-layer d_model 128 Terraformer, or the Transformer of the same size."""
  model = ml_collections.ConfigDict({  # `kind` selects the seq2seq task (`tasks.selection`).
      "kind": "terraformer", "vocab_size": 16, "d_model": 128, "n_heads": 4,
      "n_encoder_layers": 2, "n_decoder_layers": 2, "dropout": 0.0,
      "ff": {"kind": "sparse_ff", "d_ff": 512, "block_size": 16, "d_lowrank": 32},
      "lsh": {"n_buckets": 16, "chunk_len": 32}})
  if transformer:
    model.ff = ml_collections.ConfigDict({"kind": "dense", "d_ff": 512})  # Replaced, not merged.
    model.update(sru_units=0, encoder_attention="dense", decoder_attention="dense",
                 reversible=False, positions="sinusoid")
  return model


def get_config(config_string: str | None = None) -> ml_collections.ConfigDict:
  task, transformer = parse(config_string)
  config = ml_collections.ConfigDict()
  # The paper's digit counts (the schema's defaults too, written out as this experiment's
  # point; `benchmarks/length_generalization.py` scales them): train on 2-128, test on 256-300.
  config.data = ml_collections.ConfigDict({
      "name": "arithmetic", "task": task, "batch_size": 16, "train_min_len": 2,
      "train_max_len": 128, "test_min_len": 256, "test_max_len": 300, "n_eval": 256})
  config.model = model_config(transformer)
  config.train = ml_collections.ConfigDict({
      "steps": 2000, "lr": 1e-3, "grad_clip": 1.0, "weight_decay": 1e-5, "log_every": 50,
      "eval_every": 1000,
      "ckpt_every": 500})
  config.train.warmup_steps = config.train.get_ref("steps") // 10
  config.eval = ml_collections.ConfigDict({"batch_size": 16, "max_batches": 4,
                                           "max_examples": 32})
  config.mesh = ml_collections.ConfigDict({"data": -1})
  return config
