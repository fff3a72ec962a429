"""Tensor parallelism with our GPU kernels: the sigma-MoE LM with the Triton expert kernels
(`model.ff.impl=pallas`) and the fused Transformer-XL attention (`model.attention_impl=pallas`)
on `tensor=4`, `data=2,tensor=4` and `expert=4,tensor=2`, and sequence-parallel on
`data=2,tensor=4` (8 simulated CPU devices): the loss and every gradient equal one device's.

On CPU the kernels run in Pallas interpret mode, which XLA could partition; here every impl is
taken for a GPU kernel (`pallas_kernels.partitionable` False, as when tracing for a GPU), so
the experts run in the unchecked maps a GPU runs (`layers.expert_parallel`), and the fused
attention always does (`layers.xl_attention.fused_per_device`). Tolerances: those of
tests/training/test_tensor_parallel.py (a mesh changes only the order of f32 reductions).
"""

import jax
import numpy as np
import pytest
from test_tensor_parallel import ONE, assert_grads_close, lm_batch, loss_and_grads, tp_config

from sparse_jax.layers import expert_parallel

# Each mesh compiles the LM's gradient with the kernels in interpret mode: a minute or more.
pytestmark = pytest.mark.slow
__all__ = ["tp_config"]  # The fixture, shared with test_tensor_parallel.py.


@pytest.fixture
def unpartitionable_kernels(monkeypatch):
  monkeypatch.setattr(expert_parallel.pallas_kernels, "partitionable", lambda impl: False)
  jax.clear_caches()
  yield
  jax.clear_caches()


@pytest.mark.usefixtures("unpartitionable_kernels")
def test_the_lm_with_the_kernels_on_tensor_meshes_equals_one_device(tp_config):
  tp_config.model.update(attention_impl="pallas", attn_dropout=0.0)
  tp_config.model.ff.impl = "pallas"
  batch = lm_batch()
  want_loss, want_grads = loss_and_grads(tp_config, ONE, batch)
  assert all(np.abs(g).max() > 0 for g in jax.tree.leaves(want_grads))
  for shape in [(1, 1, 1, 4), (2, 1, 1, 4), (1, 1, 4, 2)]:
    loss, grads = loss_and_grads(tp_config, shape, batch)
    np.testing.assert_allclose(loss, want_loss, rtol=2e-5, err_msg=str(shape))
    assert_grads_close(grads, want_grads, shape)


@pytest.mark.usefixtures("unpartitionable_kernels")
def test_the_sequence_parallel_lm_with_the_fused_attention_equals_one_device(tp_config):
  """Sequence parallelism (`layers.sequence_parallel`): the fused XL attention runs on each
  device's rows and heads of the gathered context's projections."""
  tp_config.model.update(attention_impl="pallas", attn_dropout=0.0, sequence_parallel=True)
  batch = lm_batch()
  want_loss, want_grads = loss_and_grads(tp_config, ONE, batch)
  loss, grads = loss_and_grads(tp_config, (2, 1, 1, 4), batch)
  np.testing.assert_allclose(loss, want_loss, rtol=2e-5)
  assert_grads_close(grads, want_grads, (2, 1, 1, 4))
