"""The training and evaluation sections shared by the paper's configs (sigma-MoE App. B)."""

import ml_collections
from ml_collections import config_dict


def paper_train_and_eval(config: ml_collections.ConfigDict) -> None:
  """Adam at 2.5e-4 with cosine decay to 0 over 100k steps, no warmup, clip 0.25; evaluation
  with 4x the training context as memory (App. B); every device data-parallel unless
  overridden (README "Scaling out"). Sets `config.train`, `config.eval` and `config.mesh`.

  `eval.batch_size` and `eval.mem_len` are `FieldReference`s to `data.batch_size` and 4x
  `data.seq_len`, so they follow overrides of those (an explicit override still wins)."""
  config.train = ml_collections.ConfigDict({
      "steps": 100_000, "lr": 2.5e-4, "warmup_steps": 0, "grad_clip": 0.25,
      "log_every": 100, "eval_every": 10_000, "ckpt_every": 1000, "keep_checkpoints": 2})
  config.eval = ml_collections.ConfigDict()
  config.eval.batch_size = config.data.get_ref("batch_size").identity()
  config.eval.mem_len = config.data.get_ref("seq_len") * 4
  config.eval.max_batches = config_dict.placeholder(int)  # None: the whole split.
  config.mesh = ml_collections.ConfigDict({"data": -1, "fsdp": 1, "expert": 1})
