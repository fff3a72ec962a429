"""WikiText-103 big dense baseline ("WT-B") of the sigma-MoE paper (Table 6, 262M parameters).

SentencePiece with 8000 pieces trained on the train split; perplexity per token and per word.
Prepare the data first (README "Datasets"): put wikitext-103-raw-v1.zip into `data.manual_dir`,
or set `data.source_dir` to the extracted `wikitext-103-raw/`, or let the first run download it.
`python train.py --config=configs/wt103_b_dense.py --config.data.data_dir=DIR`.
"""

import ml_collections
from ml_collections import config_dict


def get_config() -> ml_collections.ConfigDict:
  config = ml_collections.ConfigDict()
  config.seed = 0

  config.data = ml_collections.ConfigDict()
  config.data.name = "wikitext103"
  config.data.data_dir = config_dict.placeholder(str)  # None: ~/tensorflow_datasets.
  config.data.manual_dir = config_dict.placeholder(str)  # None: <data_dir>/downloads/manual.
  config.data.source_dir = config_dict.placeholder(str)  # An extracted wikitext-103-raw/.
  config.data.download = True
  config.data.sp_vocab_size = 8000
  config.data.batch_size = 64
  config.data.seq_len = 512

  config.model = ml_collections.ConfigDict()
  config.model.vocab_size = config.data.sp_vocab_size
  config.model.d_model = 1024
  config.model.n_layers = 18
  config.model.n_heads = 16
  config.model.head_dim = 64
  config.model.mem_len = 512
  config.model.dropout = 0.2
  config.model.attn_dropout = 0.0
  config.model.tie_embeddings = False
  config.model.dtype = "float32"
  config.model.ff = ml_collections.ConfigDict({"kind": "dense", "d_ff": 4110, "dropout": 0.2})

  config.train = ml_collections.ConfigDict()
  config.train.steps = 100_000
  config.train.lr = 2.5e-4
  config.train.warmup_steps = 4000  # Table 6; then cosine decay to 0 at train.steps.
  config.train.grad_clip = 0.25
  config.train.log_every = 100
  config.train.eval_every = 10_000
  config.train.ckpt_every = 1000
  config.train.keep_checkpoints = 2

  config.eval = ml_collections.ConfigDict()
  config.eval.batch_size = 64
  config.eval.mem_len = 4 * config.data.seq_len  # the paper evaluates with 4x the context.
  config.eval.max_batches = config_dict.placeholder(int)  # None: the whole split.
  return config
