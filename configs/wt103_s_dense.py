"""WikiText-103 small dense baseline ("WT-S") of the sigma-MoE paper (Table 6, 47M parameters).

SentencePiece with 8000 pieces trained on the train split; perplexity per token and per word.
Prepare the data first (README "Datasets"): put wikitext-103-raw-v1.zip into `data.manual_dir`,
or set `data.source_dir` to the extracted `wikitext-103-raw/`, or let the first run download it.
`python train.py --config=configs/wt103_s_dense.py --config.data.data_dir=DIR`.
"""

import ml_collections
from ml_collections import config_dict

from configs import paper_training


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
  config.data.seq_len = 256

  config.model = ml_collections.ConfigDict()
  config.model.vocab_size = config.data.get_ref("sp_vocab_size").identity()  # Follows it.
  config.model.d_model = 412
  config.model.n_layers = 16
  config.model.n_heads = 10
  config.model.head_dim = 41
  config.model.mem_len = 256
  config.model.dropout = 0.1
  config.model.attn_dropout = 0.0
  config.model.tie_embeddings = False
  config.model.dtype = "float32"
  config.model.ff = ml_collections.ConfigDict({"kind": "dense", "d_ff": 2053, "dropout": 0.1})

  paper_training.authors_transformer_xl(config.model)
  paper_training.paper_train_and_eval(config)  # Table 6: no warmup.
  config.train.grad_clip = 0.1  # The authors' dense WT-S runs (MoE runs and WT-B: 0.25).
  return config
