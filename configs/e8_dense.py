"""Enwik8 dense baseline of the sigma-MoE paper (Table 6, 41M parameters), bits per character.

Prepare the data first (README "Datasets"): put enwik8.zip into `data.manual_dir` (default
`<data_dir>/downloads/manual`) or let the first run download it.
`python train.py --config=configs/e8_dense.py --config.data.data_dir=DIR`.
"""

import ml_collections
from ml_collections import config_dict

from configs import paper_training


def get_config() -> ml_collections.ConfigDict:
  config = ml_collections.ConfigDict()
  config.seed = 0

  config.data = ml_collections.ConfigDict()
  config.data.name = "enwik8"
  config.data.data_dir = config_dict.placeholder(str)  # None: ~/tensorflow_datasets.
  config.data.manual_dir = config_dict.placeholder(str)  # None: <data_dir>/downloads/manual.
  config.data.download = True
  config.data.split_bytes = config_dict.placeholder(tuple)  # None: standard 90M/5M/5M.
  config.data.batch_size = 32
  config.data.seq_len = 512

  config.model = ml_collections.ConfigDict()
  config.model.vocab_size = 256
  config.model.d_model = 512
  config.model.n_layers = 12
  config.model.n_heads = 8
  config.model.head_dim = 64
  config.model.mem_len = 512
  config.model.dropout = 0.1
  config.model.attn_dropout = 0.0
  config.model.tie_embeddings = False
  config.model.dtype = "float32"
  config.model.ff = ml_collections.ConfigDict({"kind": "dense", "d_ff": 2053, "dropout": 0.1})

  paper_training.authors_transformer_xl(config.model)
  paper_training.paper_train_and_eval(config)  # Table 6: no warmup.
  return config
