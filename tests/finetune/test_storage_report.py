"""`storage_report` on a tiny encoder against parameter counts derived by hand."""

import pytest

from sparse_jax.finetune import methods
from sparse_jax.finetune.storage import storage_report
from sparse_jax.layers.adapters import adapter_params
from sparse_jax.layers.spartan import spartan_params
from sparse_jax.models.encoder import roberta_base_config

D, LAYERS, VOCAB, POSITIONS, D_FF, CLASSES, TASKS = 16, 2, 50, 20, 32, 3, 5
N_P, N_C, BOTTLENECK = 4, 2, 4


def tiny_encoder_config():
  cfg = roberta_base_config()
  cfg.update(vocab_size=VOCAB, d_model=D, n_layers=LAYERS, n_heads=2, max_positions=POSITIONS)
  cfg.ff.d_ff = D_FF
  return cfg


def tiny_method_config(kind: str):
  method = methods.default_method_config(kind)
  method.spartan.update(n_parents=N_P, n_children=N_C, top_k=2)
  method.adapter.bottleneck = BOTTLENECK
  return method


LAYER_NORMS = 2 * D * (1 + 2 * LAYERS)  # the embedding's and two per layer: scale and bias
BACKBONE = ((VOCAB + POSITIONS + 1) * D + 2 * D              # embeddings, embedding LayerNorm
            + LAYERS * (4 * (D * D + D) + 2 * D               # attention, its LayerNorm
                        + 2 * D * D_FF + D_FF + D + 2 * D))   # feed-forward, its LayerNorm
HEAD = D * D + D + D * CLASSES + CLASSES
ADDED = {"full": 0, "head": 0, "spartan": spartan_params(D, N_P, N_C, LAYERS),
         "houlsby": adapter_params(D, BOTTLENECK, 2, LAYERS),
         "pfeiffer": adapter_params(D, BOTTLENECK, 1, LAYERS)}


@pytest.mark.parametrize("kind", methods.METHODS)
def test_counts_match_hand_derived_formulas(kind):
  report = storage_report(tiny_encoder_config(), tiny_method_config(kind),
                          num_classes=CLASSES, n_tasks=TASKS, bytes_per_param=2)
  model = BACKBONE + ADDED[kind] + HEAD
  # SPARTAN's reference trains the LayerNorms, AdapterHub's adapters do not.
  per_task = {"full": model, "head": HEAD, "spartan": ADDED[kind] + HEAD + LAYER_NORMS}.get(
      kind, ADDED[kind] + HEAD)
  storage = TASKS * model if kind == "full" else BACKBONE + TASKS * per_task
  assert report["backbone_params"] == BACKBONE
  assert report["added_params"] == ADDED[kind]
  assert report["head_params"] == HEAD
  assert report["layer_norm_params"] == LAYER_NORMS
  assert report["model_params"] == model
  assert report["trainable_params"] == per_task
  assert report["bytes_per_task"] == 2 * per_task
  assert report["storage_params"] == storage
  assert report["storage_bytes"] == 2 * storage
  assert report["storage_x_backbone"] == pytest.approx(storage / BACKBONE)


def test_full_fine_tuning_trains_the_whole_model():
  report = storage_report(tiny_encoder_config(), tiny_method_config("full"))
  assert report["trainable_params"] == report["model_params"]
  assert report["trainable_fraction"] == 1.0


def test_app_e_formula_next_to_the_actual_count():
  report = storage_report(tiny_encoder_config(), tiny_method_config("spartan"), n_tasks=TASKS)
  assert report["app_e_params"] == BACKBONE + 2 * TASKS * (N_P + N_P * N_C) * D * LAYERS
  # App. E counts 2 (P + P C) d per layer; the memory has (P + 2 P C) d.
  assert report["added_params"] == (N_P + 2 * N_P * N_C) * D * LAYERS
  assert report["app_e_bytes"] == 4 * report["app_e_params"]
