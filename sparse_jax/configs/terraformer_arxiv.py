"""arXiv summarisation with Terraformer (Scaling Transformers Sec. 4.4, Table 5).

    sparse-jax train --config=terraformer_arxiv:small --workdir=runs/arxiv_small
    sparse-jax eval --workdir=runs/arxiv_small --split=test        # ROUGE-1/2/L/Lsum F1
    sparse-jax train --config=terraformer_arxiv:paper --workdir=runs/arxiv_800m

Data: TFDS `scientific_papers/arxiv` 1.1.1 (`sparse_jax.data.arxiv`): the official archive is
downloaded once into `data.data_dir` (or read from `data.manual_dir`), prepared as
array_record files, and a SentencePiece vocabulary is trained on the train split;
`--config.data.max_examples=N` reads only the first N records of each split.

`paper` is the 800M Terraformer of the paper (footnote 2 and Sec. 4.4) as Trax's
`scientific_papers_terraformer.gin` trains it: d_model 1024, 16 heads, 24 encoder and 24
decoder layers, sparse FF (d_ff 6144, blocks of 64), sparse QKV (S = 16), loss sparsity 4,
LSH attention (2 hashes, 128 buckets, chunks of 128, dropout 0.2), the 32-unit SRU branch,
dropout 0.2, FF activation dropout 0.1; articles of 15359 tokens + PAD (the gin appends
padding, `data.article_end`), abstracts of 1023 + EOS, a 32k vocabulary; batch 32, Adafactor
with `lr * min(1, t / 10k) * sqrt(10k / max(t, 10k))` (peak 0.01) and Trax's weight decay
(`w <- (1 - 1e-5) w` every step). Trax's Terraformer details are the model schema's defaults
(`models.terraformer_config`): fixed-base positions, dropout masks shared along the length
axis, the uniform embedding init, biases on dense attention projections.
The paper fine-tunes a C4-pretrained model; this trains from scratch (we have no C4 run).

`small` trains on a 2-core CPU: d_model 128, 2 + 2 layers, articles cut to 2047 tokens and
abstracts to 255, an 8k vocabulary, the paper's kinds of layers at small widths.
"""

import ml_collections

SIZES = ("paper", "small")


def paper_model() -> ml_collections.ConfigDict:
  """The 800M Terraformer (its `vocab_size` is set by `get_config`). Its LSH is the schema's
  default, the paper's: 2 hashes, 128 buckets, chunks of 128."""
  return ml_collections.ConfigDict({
      "kind": "terraformer",  # Selects the seq2seq task (`tasks.selection`).
      "d_model": 1024, "n_heads": 16, "n_encoder_layers": 24, "n_decoder_layers": 24,
      "dropout": 0.2, "attn_dropout": 0.2, "ff_dropout": 0.1,
      "ff": {"kind": "sparse_ff", "d_ff": 6144, "block_size": 64},
      "decoder_qkv": "sparse", "attention_sparsity": 16, "lsh": {}, "loss_sparsity": 4})


def small_model() -> ml_collections.ConfigDict:
  model = paper_model()
  model.update(d_model=128, n_heads=4, n_encoder_layers=2, n_decoder_layers=2, dropout=0.1,
               attn_dropout=0.1, ff_dropout=0.05, attention_sparsity=4)
  model.ff = ml_collections.ConfigDict({"kind": "sparse_ff", "d_ff": 512, "block_size": 16})
  model.lsh = ml_collections.ConfigDict({"n_buckets": 32, "chunk_len": 64})
  return model


def get_config(size: str | None = None) -> ml_collections.ConfigDict:
  size = size or "small"
  if size not in SIZES:
    raise ValueError(f"config string {size!r}: expected one of {SIZES}.")
  paper = size == "paper"
  config = ml_collections.ConfigDict()
  # The paper's lengths (15359 + PAD, 1023 + EOS) are the schema's defaults. The vocabulary is
  # written out for both sizes: `model.vocab_size` follows it.
  config.data = ml_collections.ConfigDict({
      "name": "arxiv", "batch_size": 32 if paper else 4, "vocab_size": 32_000 if paper else 8000})
  if not paper:
    config.data.update(max_input_len=2047, max_target_len=255)
  config.model = paper_model() if paper else small_model()
  config.model.vocab_size = config.data.get_ref("vocab_size")
  config.train = ml_collections.ConfigDict({
      "steps": 1_000_000 if paper else 5000, "lr": 0.01, "schedule": "rsqrt",
      "optimizer": "adafactor", "weight_decay": 1e-5,
      "log_every": 100 if paper else 50, "eval_every": 500,
      "ckpt_every": 1000 if paper else 500})
  config.train.warmup_steps = 10_000 if paper else config.train.get_ref("steps") // 10
  config.eval = ml_collections.ConfigDict({"batch_size": 8 if paper else 4, "max_batches": 10})
  if not paper:
    config.eval.max_examples = 16  # The schema's default, the paper's: 64.
  config.mesh = ml_collections.ConfigDict({"data": -1})
  return config
