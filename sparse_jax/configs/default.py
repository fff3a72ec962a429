"""The embedded default: a small sigma-MoE Transformer-XL on `builtin` (no download).

`sparse-jax train` runs this into `runs/default`.
Like every config file it states only what differs from the schemas' defaults
(`sparse_jax.models.lm_config`, `sparse_jax.layers.registry`, ...); `--config.x.y=v` sets any
field, written here or not (`--config.data.source_root=DIR` reads another source tree than
this Python's standard library). Derived values are `FieldReference`s, so they follow an
override of what they derive from: `train.warmup_steps` is 10% of `train.steps` and
`eval.mem_len` is 4x `data.seq_len` (`--config.train.steps=20` warms up for 2 steps; an
explicit override of either still wins).
"""

import ml_collections


def get_config() -> ml_collections.ConfigDict:
  config = ml_collections.ConfigDict()
  config.seed = 0  # The schema's default; `tasks.lm.build_model(config)` reads it.
  config.data = ml_collections.ConfigDict({"name": "builtin", "batch_size": 16, "seq_len": 128})
  config.model = ml_collections.ConfigDict({
      "vocab_size": 256, "d_model": 256, "n_layers": 4, "n_heads": 4, "mem_len": 128,
      "dropout": 0.0})
  # sigma-MoE (paper Sec. 5): 8 experts of 128, K=2, parameter-matched to a dense d_ff of
  # 1024 (`sparse_jax/configs/default_dense.py`) with 25% of its FF FLOPs.
  config.model.ff = ml_collections.ConfigDict({
      "kind": "sigma_moe", "n_experts": 8, "expert_size": 128, "k": 2, "reg_coef": 0.001})
  config.train = ml_collections.ConfigDict({
      "steps": 400, "lr": 2e-3, "grad_clip": 0.25, "log_every": 20, "eval_every": 200,
      "ckpt_every": 200})
  config.train.warmup_steps = config.train.get_ref("steps") // 10
  # Every device data-parallel: -1 takes all devices (docs/scaling_out.md).
  config.mesh = ml_collections.ConfigDict({"data": -1})
  config.eval = ml_collections.ConfigDict({"batch_size": 16})
  config.eval.mem_len = config.data.get_ref("seq_len") * 4  # The paper's 4x the context.
  config.eval.max_batches = 50  # None evaluates the whole split.
  return config
