"""What the paper's configs share: the training and evaluation sections (sigma-MoE App. B)
and the details of the authors' Transformer-XL LM."""

import ml_collections
from ml_collections import config_dict


def paper_train_and_eval(config: ml_collections.ConfigDict) -> None:
  """Adam at 2.5e-4 with cosine decay to 0 over 100k steps, no warmup, clip 0.25; evaluation
  with 4x the training context as memory (App. B) on 4 streams, as the authors' code
  evaluates (fewer streams start with an empty memory than at the training batch size);
  every device data-parallel unless overridden (README "Scaling out"). Sets `config.train`,
  `config.eval` and `config.mesh`.

  `eval.mem_len` is a `FieldReference` to 4x `data.seq_len`, so it follows an override of
  the context (an explicit override still wins)."""
  config.train = ml_collections.ConfigDict({
      "steps": 100_000, "lr": 2.5e-4, "warmup_steps": 0, "grad_clip": 0.25,
      "log_every": 100, "eval_every": 10_000, "ckpt_every": 1000, "keep_checkpoints": 2})
  # `--config.train.profile_steps=10,15`: a jax.profiler trace of steps 11-15 in
  # WORKDIR/profile (README "Profiles"); None: no trace.
  config.train.profile_steps = config_dict.placeholder(str)
  config.eval = ml_collections.ConfigDict()
  config.eval.batch_size = 4
  config.eval.mem_len = config.data.get_ref("seq_len") * 4
  config.eval.max_batches = config_dict.placeholder(int)  # None: the whole split.
  config.mesh = ml_collections.ConfigDict({"data": -1, "fsdp": 1, "expert": 1})


def authors_transformer_xl(model: ml_collections.ConfigDict) -> None:
  """The sigma-MoE authors' LM details (their code, not the paper's text): Xavier-uniform
  token embeddings, dropout before the output layer, LayerNorm epsilon 1e-5 and a learned
  attention scale starting at 1/sqrt(head_dim). The output layer has a bias in every LM."""
  model.update(embed_init="xavier", output_dropout=True, layer_norm_eps=1e-5,
               attn_scale="learned")
