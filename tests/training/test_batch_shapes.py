"""`Task.batch_shapes` (what `--compile_only` compiles the training step for) is what
`load_data` really yields: the same names, global shapes and dtypes."""

import jax
import numpy as np

from sparse_jax.configs import terraformer_arithmetic
from sparse_jax import parallel
from sparse_jax.tasks import task_for
from sparse_jax.training.placement import Placement


def _assert_batch_matches(task):
  placement = Placement(parallel.make_mesh((1, 1, 1), jax.devices()[:1]))
  batch = next(task.load_data(placement))
  expected = task.batch_shapes()
  assert set(batch) == set(expected)
  for name, value in batch.items():
    assert (value.shape, np.dtype(value.dtype)) == (expected[name].shape,
                                                    np.dtype(expected[name].dtype)), name


def test_language_model_batches(tiny_config):
  _assert_batch_matches(task_for(tiny_config))


def test_seq2seq_batches():
  config = terraformer_arithmetic.get_config()
  config.data.batch_size = 4
  _assert_batch_matches(task_for(config))
