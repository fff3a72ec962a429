"""The small parameter-matched comparison of the sigma-MoE paper's FF approximations.

The base model (dense, d_ff 514) has one FF layer of 132k parameters, matched by sigma-MoE
with 8 experts of 64 (K=2: 25% of the dense FF FLOPs). `benchmarks/quality_small.py` trains
this config once per `model.ff` variant; train it alone with
`sparse-jax train --config=quality_small`.
"""

from sparse_jax.configs import default


def get_config():
  config = default.get_config()  # Its data, 4 layers of 4 heads, memory and training.
  config.model.d_model = 128
  config.model.ff = {"kind": "dense", "d_ff": 514}
  config.train.update(steps=1000, log_every=50, eval_every=1000,
                      ckpt_every=1000)  # warmup_steps: 10% of the steps, as in default.py.
  config.eval.max_batches = 100
  return config
