"""The embedded default: a small sigma-MoE Transformer-XL on `builtin` (no download).

`python train.py` runs this into `runs/default`; it finishes in about 10 minutes on 2 CPU cores.
Derived values are `FieldReference`s, so they follow an override of what they derive from:
`train.warmup_steps` is 10% of `train.steps` and `eval.mem_len` is 4x `data.seq_len`
(`--config.train.steps=20` warms up for 2 steps; an explicit override of either still wins).
"""

import ml_collections
from ml_collections import config_dict


def get_config() -> ml_collections.ConfigDict:
  config = ml_collections.ConfigDict()
  config.seed = 0

  config.data = ml_collections.ConfigDict()
  config.data.name = "builtin"
  config.data.data_dir = config_dict.placeholder(str)  # None: ~/tensorflow_datasets.
  config.data.source_root = config_dict.placeholder(str)  # builtin: None = this stdlib.
  config.data.batch_size = 16
  config.data.seq_len = 128

  config.model = ml_collections.ConfigDict()
  config.model.vocab_size = 256
  config.model.d_model = 256
  config.model.n_layers = 4
  config.model.n_heads = 4
  config.model.head_dim = config_dict.placeholder(int)  # None: d_model // n_heads
  config.model.mem_len = 128
  config.model.dropout = 0.0
  config.model.attn_dropout = 0.0
  config.model.tie_embeddings = False
  config.model.dtype = "float32"
  # sigma-MoE (paper Sec. 5): 8 experts of 128, K=2, parameter-matched to a dense d_ff of
  # 1024 (`configs/default_dense.py`) with 25% of its FF FLOPs.
  config.model.ff = ml_collections.ConfigDict({
      "kind": "sigma_moe", "n_experts": 8, "expert_size": 128, "k": 2, "expert_dropout": 0.0,
      "reg_coef": 0.001, "init": "sigma", "expert_hidden_dropout": 0.0, "impl": "auto"})

  config.train = ml_collections.ConfigDict()
  config.train.steps = 400
  config.train.lr = 2e-3
  config.train.warmup_steps = config.train.get_ref("steps") // 10
  config.train.grad_clip = 0.25
  config.train.log_every = 20
  config.train.eval_every = 200
  config.train.ckpt_every = 200
  config.train.keep_checkpoints = 2

  # Sizes of the (data, fsdp, expert) device mesh; -1 takes all remaining devices
  # (README "Scaling out").
  config.mesh = ml_collections.ConfigDict({"data": -1, "fsdp": 1, "expert": 1})

  config.eval = ml_collections.ConfigDict()
  config.eval.batch_size = 16
  config.eval.mem_len = config.data.get_ref("seq_len") * 4  # The paper's 4x the context.
  config.eval.max_batches = 50  # None evaluates the whole split.
  return config
