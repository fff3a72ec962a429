"""Enwik8 dense baseline of the sigma-MoE paper (Table 6, 41M parameters), bits per character.

Prepare the data first (docs/datasets.md): put enwik8.zip into `data.manual_dir` (default
`<data_dir>/downloads/manual`) or let the first run download it; `data.split_bytes` (default
the standard 90M/5M/5M) sets other splits.
`sparse-jax train --config=e8_dense --config.data.data_dir=DIR`.
"""

import ml_collections

from sparse_jax.configs import paper_training


def get_config() -> ml_collections.ConfigDict:
  config = paper_training.transformer_xl(
      {"name": "enwik8"}, batch_size=32, context=512, d_model=512, n_layers=12, n_heads=8,
      head_dim=64, dropout=0.1, d_ff=2053)
  config.model.vocab_size = 256  # Bytes.
  return config
