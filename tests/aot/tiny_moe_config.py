"""A tiny sigma-MoE language model for the `--compile_only` tests: compiled, never trained,
so no data is read. Every mesh axis but `data` is 1; `data` takes all the target's devices."""

from sparse_jax.configs import default


def get_config():
  config = default.get_config()
  config.data.update(batch_size=8, seq_len=32)
  config.model.update(d_model=64, n_layers=2, n_heads=2, mem_len=32)
  config.model.ff.update(n_experts=4, expert_size=32, k=2)
  config.eval.update(batch_size=8, mem_len=64)
  return config
