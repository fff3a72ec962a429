"""Data: TFDS builders and grain pipelines for language modelling."""

from sparse_jax.data.datasets import DATASETS, SPLITS, load_tokens, spec
from sparse_jax.data.lm_stream import StreamSegments, eval_batches, train_iterator

__all__ = ["DATASETS", "SPLITS", "StreamSegments", "eval_batches", "load_tokens", "spec",
           "train_iterator"]
