"""WikiText-103 small dense baseline ("WT-S") of the sigma-MoE paper (Table 6, 47M parameters).

SentencePiece with 8000 pieces trained on the train split; perplexity per token and per word.
Prepare the data first (docs/datasets.md): put wikitext-103-raw-v1.zip into `data.manual_dir`,
or set `data.source_dir` to the extracted `wikitext-103-raw/`, or let the first run download it.
`sparse-jax train --config=wt103_s_dense --config.data.data_dir=DIR`.
"""

import ml_collections

from sparse_jax.configs import paper_training


def on_wikitext103(**sizes) -> ml_collections.ConfigDict:
  """The paper's Transformer-XL (`paper_training.transformer_xl`, `sizes` its arguments but
  the data's) on WikiText-103 at batch 64, its vocabulary that of the SentencePiece model."""
  # 8000 pieces, the schema's default too: written out because `model.vocab_size` follows it
  # (`--config.data.sp_vocab_size=N` sizes both).
  config = paper_training.transformer_xl({"name": "wikitext103", "sp_vocab_size": 8000},
                                         batch_size=64, **sizes)
  config.model.vocab_size = config.data.get_ref("sp_vocab_size").identity()
  return config


def get_config() -> ml_collections.ConfigDict:
  config = on_wikitext103(context=256, d_model=412, n_layers=16, n_heads=10, head_dim=41,
                          dropout=0.1, d_ff=2053)
  config.train.grad_clip = 0.1  # The authors' dense WT-S runs (MoE runs and WT-B: 0.25).
  return config
