"""The small parameter-matched comparison of the sigma-MoE paper's FF approximations.

The base model (dense, d_ff 514) has one FF layer of 132k parameters, matched by sigma-MoE
with 8 experts of 64 (K=2: 25% of the dense FF FLOPs). `benchmarks/quality_small.py` trains
this config once per `model.ff` variant; train it alone with
`python train.py --config=configs/quality_small.py`.
"""

from configs import default


def get_config():
  config = default.get_config()
  config.model.update(d_model=128, n_layers=4, n_heads=4, mem_len=128, dropout=0.0)
  config.model.ff = {"kind": "dense", "d_ff": 514, "dropout": 0.0}
  config.train.update(steps=1000, lr=2e-3, log_every=50, eval_every=1000,
                      ckpt_every=1000)  # warmup_steps: 10% of the steps, as in default.py.
  config.eval.max_batches = 100
  return config
