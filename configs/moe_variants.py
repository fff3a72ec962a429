"""Every row of the paper's Tables 4 and 8 on one of its models: `<model>,<variant>`.

    python train.py --config=configs/moe_variants.py:wt103_s,switch
    python train.py --config=configs/moe_variants.py:e8,no_reg

Models are those of `configs/sigma_moe_paper.py`. Each variant changes only the FF of that
model's sigma-MoE config, keeping the parameter count (same N_E and G) unless the variant
is about K and G themselves:

  sigma_moe            the paper's model (Table 7)
  switch               softmax, top-1 without renormalisation, capacity 1.25, Eq. 17 loss 0.01
  noisy_topk           Shazeer et al. noisy gating, renormalised top-k, CV^2 loss 0.01
  sbase                Sinkhorn-balanced sigmoid routing in training, top-k at evaluation
  softmax_renorm       softmax after top-k
  softmax_no_renorm    top-k after softmax
  standard_dropout     dropout inside the experts instead of expert dropout (same rate)
  no_reg               no entropy regulariser (gamma = 0)
  standard_init        W2 initialised with the fan-in of one expert (G) instead of d_ff
  k2_g256 / k1_g512    the same active size G*K with fewer, larger experts (Table 8)
  pkm_relu / pkm_softmax  parameter-matched product-key memory (62 sub-keys; 89 for wt103_b)
  topk                 the dense model with a Top-K (K=128) activation
"""

import ml_collections

from configs import sigma_moe_paper


def _variant_ff(ff: ml_collections.ConfigDict, variant: str, model: str) -> dict:
  moe_routing = {"n_experts": ff.n_experts, "expert_size": ff.expert_size, "impl": ff.impl,
                 "reg_coef": ff.reg_coef}
  active = ff.k * ff.expert_size
  pkm_subkeys = 89 if model == "wt103_b" else 62
  variants = {
      "sigma_moe": dict(ff),
      "switch": {**moe_routing, "kind": "switch", "capacity_factor": 1.25, "reg_coef": 0.01},
      "noisy_topk": {**moe_routing, "kind": "noisy_topk", "k": ff.k, "reg_coef": 0.01},
      "sbase": {**moe_routing, "kind": "sbase", "k": ff.k},
      "softmax_renorm": {**moe_routing, "kind": "softmax_moe", "k": ff.k, "renorm": True},
      "softmax_no_renorm": {**moe_routing, "kind": "softmax_moe", "k": ff.k, "renorm": False},
      "standard_dropout": {**ff, "expert_dropout": 0.0,
                           "expert_hidden_dropout": ff.expert_dropout},
      "no_reg": {**ff, "reg_coef": 0.0},
      "standard_init": {**ff, "init": "standard"},
      "k2_g256": {**ff, "k": 2, "expert_size": active // 2,
                  "n_experts": ff.n_experts * ff.expert_size // (active // 2)},
      "k1_g512": {**ff, "k": 1, "expert_size": active,
                  "n_experts": ff.n_experts * ff.expert_size // active},
      "pkm_relu": {"kind": "pkm", "n_subkeys": pkm_subkeys, "knn": 128, "n_heads": 4,
                   "activation": "relu"},
      "pkm_softmax": {"kind": "pkm", "n_subkeys": pkm_subkeys, "knn": 128, "n_heads": 4,
                      "activation": "softmax"},
  }
  if variant not in variants and variant != "topk":
    raise ValueError(f"moe_variants.py:<model>,<variant>: variant must be one of "
                     f"{sorted([*variants, 'topk'])}; got {variant!r}.")
  return variants.get(variant)


def get_config(arg: str = "wt103_s,sigma_moe") -> ml_collections.ConfigDict:
  model, _, variant = arg.partition(",")
  config = sigma_moe_paper.get_config(model)
  if variant == "topk":
    dense = sigma_moe_paper.MODELS[model][0].get_config()
    config.model.ff = {**dense.model.ff, "kind": "topk", "k": 128}
  else:
    config.model.ff = ml_collections.ConfigDict(_variant_ff(config.model.ff, variant, model))
  return config
