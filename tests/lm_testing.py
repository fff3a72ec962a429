"""The tiny language-model config the training tests share, and decoding a whole sequence
token by token (the decoding tests)."""

import jax.numpy as jnp
from flax import nnx


def tiny_lm_config(stdlib_slice: str, data_dir: str):
  """The default config (a sigma-MoE LM) shrunk to a model and data that train in seconds."""
  from sparse_jax.configs import default

  config = default.get_config()
  config.data.source_root = stdlib_slice
  config.data.data_dir = data_dir
  config.data.batch_size = 4
  config.data.seq_len = 16
  config.model.update(d_model=32, n_layers=2, n_heads=2, mem_len=16, dropout=0.1)
  config.model.ff.update(n_experts=4, expert_size=16, k=2, expert_dropout=0.1)
  config.train.update(steps=6, warmup_steps=2, log_every=1, eval_every=100, ckpt_every=3)
  config.eval.update(batch_size=2, mem_len=32, max_batches=4)
  config.mesh.data = 1  # one device; tests/training/test_parallel_training.py uses meshes.
  return config


@nnx.jit
def decode_all(lm, tokens_bt):
  """Logits of every position, fed one token at a time through the decode cache."""
  cache = lm.init_cache(tokens_bt.shape[0], tokens_bt.shape[1])
  logits = []
  for i in range(tokens_bt.shape[1]):
    step_logits, cache = lm.decode_step(tokens_bt[:, i:i + 1], cache)
    logits.append(step_logits)
  return jnp.concatenate(logits, axis=1)
