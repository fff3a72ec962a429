"""What the sigma-MoE paper's configs share: its Transformer-XL LM (`transformer_xl`), with the
authors' details (`authors_transformer_xl`) and the paper's training and evaluation
(`paper_train_and_eval`, App. B)."""

import ml_collections


def transformer_xl(data: dict, *, batch_size: int, context: int, d_model: int, n_layers: int,
                   n_heads: int, head_dim: int, dropout: float, d_ff: int
                   ) -> ml_collections.ConfigDict:
  """A dense baseline of the paper (Table 6) on `data` (its `name` and dataset fields):
  `batch_size` streams of `context` tokens, an XL memory of `context` positions, `dropout`
  in the model and its dense FF of `d_ff`; the authors' LM details; the paper's training and
  evaluation. The caller sets `model.vocab_size`."""
  config = ml_collections.ConfigDict()
  config.seed = 0  # The schema's default; `tasks.lm.build_model(config)` reads it.
  config.data = ml_collections.ConfigDict({**data, "batch_size": batch_size, "seq_len": context})
  config.model = ml_collections.ConfigDict({
      "d_model": d_model, "n_layers": n_layers, "n_heads": n_heads, "head_dim": head_dim,
      "mem_len": context, "dropout": dropout,
      "ff": {"kind": "dense", "d_ff": d_ff, "dropout": dropout}})
  authors_transformer_xl(config.model)
  paper_train_and_eval(config)
  return config


def paper_train_and_eval(config: ml_collections.ConfigDict) -> None:
  """Adam at 2.5e-4 with cosine decay to 0 over 100k steps, no warmup, clip 0.25; evaluation
  with 4x the training context as memory (App. B) on 4 streams, as the authors' code
  evaluates (fewer streams start with an empty memory than at the training batch size), over
  the whole split; every device data-parallel unless overridden (docs/scaling_out.md). Sets
  `config.train`, `config.eval` and `config.mesh`. `--config.train.profile_steps=10,15`
  writes a jax.profiler trace of steps 11-15 into WORKDIR/profile (docs/training.md "Profiles").

  `eval.mem_len` is a `FieldReference` to 4x `data.seq_len`, so it follows an override of
  the context (an explicit override still wins)."""
  config.train = ml_collections.ConfigDict({
      "steps": 100_000, "lr": 2.5e-4, "grad_clip": 0.25, "log_every": 100,
      "eval_every": 10_000, "ckpt_every": 1000,
      "warmup_steps": 0})  # The schema's default, written as the paper's setting (Table 6).
  config.eval = ml_collections.ConfigDict({"batch_size": 4})
  config.eval.mem_len = config.data.get_ref("seq_len") * 4
  config.mesh = ml_collections.ConfigDict({"data": -1})


def authors_transformer_xl(model: ml_collections.ConfigDict) -> None:
  """The sigma-MoE authors' LM details (their code, not the paper's text): Xavier-uniform
  token embeddings, dropout before the output layer, LayerNorm epsilon 1e-5 and a learned
  attention scale starting at 1/sqrt(head_dim). The output layer has a bias in every LM."""
  model.update(embed_init="xavier", output_dropout=True, layer_norm_eps=1e-5,
               attn_scale="learned")
