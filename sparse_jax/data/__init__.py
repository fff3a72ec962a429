"""Data: TFDS builders and grain pipelines for language modelling."""

from sparse_jax.data.datasets import (DATASETS, SPLITS, DatasetSpec, TokenSplit, load_split,
                                      load_tokenizer, load_tokens, prepared_builder, spec)
from sparse_jax.data.lm_stream import StreamSegments, eval_batches, train_iterator

__all__ = ["DATASETS", "SPLITS", "DatasetSpec", "StreamSegments", "TokenSplit", "eval_batches",
           "load_split", "load_tokenizer", "load_tokens", "prepared_builder", "spec",
           "train_iterator"]
