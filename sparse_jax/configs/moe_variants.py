"""Every row of the paper's Tables 2, 4, 5 and 8 on one of its models: `<model>,<variant>`.

    sparse-jax train --config=moe_variants:wt103_s,switch
    sparse-jax train --config=moe_variants:e8,no_reg

Models are those of `sparse_jax/configs/sigma_moe_paper.py`. Each variant is what the authors' released
runs trained (their code; docs/sigma_moe.md "Feed-forward kinds" says where that differs from the
paper's text). It changes only the FF of that model's sigma-MoE config, keeping the
parameter count (same N_E * G) unless the variant is about the size itself:

  sigma_moe            the paper's model (Table 7)
  switch               Table 4's Switch: top-1 softmax without renormalisation, G = K*G
                       (512) with N_E/K experts, no capacity limit, the authors' balance
                       loss (Eq. 17 / N_E^2) at 0.01 and their init (scale 0.1)
  switch_g128          the same with the model's N_E experts of G (the other Switch row)
  noisy_topk           Shazeer et al. noisy gating, renormalised top-k, Eq. 14's CV loss 0.01
  sbase                Sinkhorn-balanced sigmoid routing per sequence in training, top-k at
                       evaluation, the sweeps' expert dropout
  softmax_renorm       softmax after top-k (regulariser on the k selected logits), the
                       sweeps' expert dropout
  softmax_no_renorm    top-k after softmax, the sweeps' expert dropout
  standard_dropout     dropout on the gated expert units at the model's dropout rate instead of
                       expert dropout
  no_reg               no entropy regulariser and no expert dropout (gamma = delta = 0)
  standard_init        W2 initialised with the fan-in of one expert (G) instead of d_ff
  k2_g256 / k1_g512    the same active size G*K with fewer, larger experts (Table 8)
  pkm_relu             parameter-matched product-key memory (62 sub-keys; 89 for wt103_b),
                       4 heads, knn 128 (>= sub-keys: the authors' dense path), their init
                       (the PKM variants exist for wt103_s, wt103_b and e8, as in the paper)
  pkm_relu_init        the same with the dense baseline's init ("PKM + init", Table 2/5)
  pkm_softmax          parameter-matched PKM with Lample's softmax (Table 5)
  pkm_values_relu / pkm_values_softmax
                       value-count matched PKM (46 sub-keys; 64 for wt103_b; Table 5)
  topk                 the dense baseline with a Top-K (K=128) activation after its dropout
"""

import ml_collections

from sparse_jax.configs import dense_paper, sigma_moe_paper

VARIANTS = ("sigma_moe", "switch", "switch_g128", "noisy_topk", "sbase", "softmax_renorm",
            "softmax_no_renorm", "standard_dropout", "no_reg", "standard_init", "k2_g256",
            "k1_g512", "pkm_relu", "pkm_relu_init", "pkm_softmax", "pkm_values_relu",
            "pkm_values_softmax", "topk")


# Sub-keys of the paper's PKM rows (App. A.3): (parameter matched, value-count matched).
PKM_SUBKEYS = {"wt103_s": (62, 46), "wt103_b": (89, 64), "e8": (62, 46)}


def _pkm(model: str, matched: str, activation: str, init: str = "authors") -> dict:
  if model not in PKM_SUBKEYS:
    raise ValueError(f"moe_variants.py: the PKM variants exist for {sorted(PKM_SUBKEYS)} "
                     f"(the paper's PKM rows); got model {model!r}.")
  n_subkeys = PKM_SUBKEYS[model][0 if matched == "params" else 1]
  return {"kind": "pkm", "n_subkeys": n_subkeys, "knn": 128, "activation": activation,
          "init": init}


def _variant_ff(config: ml_collections.ConfigDict, variant: str, model: str) -> dict:
  ff = config.model.ff
  moe_routing = {"n_experts": ff.n_experts, "expert_size": ff.expert_size,
                 "reg_coef": ff.reg_coef}
  sweep_delta = sigma_moe_paper.SWEEP_EXPERT_DROPOUT[model]
  active = ff.k * ff.expert_size
  variants = {
      "sigma_moe": dict(ff),
      "switch": {**moe_routing, "kind": "switch", "reg_coef": 0.01, "expert_size": active,
                 "n_experts": ff.n_experts * ff.expert_size // active},
      "switch_g128": {**moe_routing, "kind": "switch", "reg_coef": 0.01},
      "noisy_topk": {**moe_routing, "kind": "noisy_topk", "k": ff.k, "reg_coef": 0.01},
      "sbase": {**moe_routing, "kind": "sbase", "k": ff.k, "expert_dropout": sweep_delta},
      "softmax_renorm": {**moe_routing, "kind": "softmax_moe", "k": ff.k, "renorm": True,
                         "expert_dropout": sweep_delta},
      "softmax_no_renorm": {**moe_routing, "kind": "softmax_moe", "k": ff.k, "renorm": False,
                            "expert_dropout": sweep_delta},
      "standard_dropout": {**ff, "expert_dropout": 0.0,
                           "expert_hidden_dropout": config.model.dropout},
      "no_reg": {**ff, "reg_coef": 0.0, "expert_dropout": 0.0},
      "standard_init": {**ff, "init": "standard"},
      "k2_g256": {**ff, "k": 2, "expert_size": active // 2,
                  "n_experts": ff.n_experts * ff.expert_size // (active // 2)},
      "k1_g512": {**ff, "k": 1, "expert_size": active,
                  "n_experts": ff.n_experts * ff.expert_size // active},
  }
  pkm = {"pkm_relu": ("params", "relu", "authors"), "pkm_relu_init": ("params", "relu", "dense"),
         "pkm_softmax": ("params", "softmax", "authors"),
         "pkm_values_relu": ("values", "relu", "authors"),
         "pkm_values_softmax": ("values", "softmax", "authors")}
  if variant in pkm:
    return _pkm(model, *pkm[variant])
  return variants[variant]


def get_config(arg: str = "wt103_s,sigma_moe") -> ml_collections.ConfigDict:
  model, _, variant = arg.partition(",")
  if variant not in VARIANTS:
    raise ValueError(f"moe_variants.py:<model>,<variant>: variant must be one of "
                     f"{list(VARIANTS)}; got {variant!r}.")
  config = sigma_moe_paper.get_config(model)
  if variant == "topk":  # The dense baseline itself (its clipping too), Top-K in its FF.
    config = dense_paper.get_config(model)
    config.model.ff.update({"kind": "topk", "k": 128, "after_dropout": True})
  else:
    config.model.ff = ml_collections.ConfigDict(_variant_ff(config, variant, model))
  return config
