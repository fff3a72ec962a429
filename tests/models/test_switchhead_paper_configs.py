"""sparse_jax/configs/switchhead_paper.py: each trio has the paper's parameter count, and the attention
MACs and memory of the authors' formula (moe_attention `paper/common.py`) as their tables
print them (MACs and floats per layer and segment, in millions to one decimal: the paper's
"170M vs 453M" for WT-103 small; the other rows evaluated from their formula with their sweeps'
shapes)."""

import pytest

from sparse_jax.configs import switchhead_paper
from sparse_jax.models.accounting import attention_report, model_report

# model: paper's parameters, {variant: (attention MACs M, attention memory M floats)}.
PAPER = {
    "wt103_s": (47e6, {"dense": (453.4, 3.46), "switchhead": (170.4, 0.76),
                       "dense_few": (453.4, 1.36)}),
    "wt103_b": (262e6, {"dense": (5368.7, 20.97), "switchhead": (1955.6, 2.92),
                        "dense_few": (5368.7, 6.29)}),
    "c4_b": (262e6, {"dense": (5368.7, 20.97), "switchhead": (2358.1, 5.58),
                     "dense_few": (5368.7, 8.39)}),
    "e8": (41e6, {"dense": (1610.6, 10.49), "switchhead": (709.3, 2.79),
                  "dense_few": (1610.6, 4.19)}),
}


@pytest.mark.parametrize("model", sorted(PAPER))
def test_the_trio_matches_the_papers_parameters_and_attention_cost(model):
  paper_params, rows = PAPER[model]
  counts = {}
  for variant, (macs_m, memory_m) in rows.items():
    config = switchhead_paper.get_config(f"{model},{variant}")
    counts[variant] = model_report(config.model)["total_params"]
    assert abs(counts[variant] / paper_params - 1) < 0.01, (variant, counts[variant])
    report = attention_report(config.model, config.data.seq_len)
    assert round(report["attention_macs_per_layer"] / 1e6, 1) == macs_m, variant
    assert round(report["attention_memory_floats_per_layer"] / 1e6, 2) == memory_m, variant
  # "At equal parameters": the three within 0.2% of each other.
  assert max(counts.values()) / min(counts.values()) - 1 < 0.002, counts


def test_switchhead_rows_use_xl_switchhead_with_a_fixed_scale():
  config = switchhead_paper.get_config("wt103_s,switchhead")
  assert config.model.attention == "switchhead_xl" and config.model.attn_scale == "fixed"
  assert (config.model.n_heads, config.model.head_dim, config.model.attention_experts,
          config.model.attention_k, config.model.ff.d_ff) == (2, 76, 5, 2, 2080)


def test_a_bad_spec_names_the_choices():
  with pytest.raises(ValueError, match="wt103_s"):
    switchhead_paper.get_config("wt103_s,sparse")
