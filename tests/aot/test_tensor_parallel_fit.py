"""`benchmarks/tensor_parallel_fit.py`: its layer search (on stand-in compiles), its mesh
argument, and a tiny Scaling Transformer's decoding step compiled for a TPU v5e slice.

The module is imported inside each test: importing it sets JAX's configuration (the CPU
backend, no persistent cache, optimised compiles), which this directory's fixture restores
after each test.
"""

import importlib

import pytest

from aot_testing import needs_tpu
from sparse_jax.validation import ConfigError


@pytest.fixture
def fit():
  return importlib.import_module("benchmarks.tensor_parallel_fit")


def _affine_probe(base_gib: float, per_layer_gib: float, device_gib: float):
  """A stand-in for compiling `n` layers: memory `base + n * per_layer`; libtpu's refusal
  (no peak) above the device. Records the sizes it was asked for."""
  asked = []

  def fits_at(n_layers):
    asked.append(n_layers)
    peak = base_gib + n_layers * per_layer_gib
    return (True, peak) if peak <= device_gib else (False, None)

  return fits_at, asked


@pytest.mark.parametrize("base,per_layer,device,largest", [
    (1.0, 0.5, 16.0, 30),  # Exactly on the prediction: one compile past it.
    (10.0, 3.0, 16.0, 2),  # The second size (4) is already too big.
    (15.5, 1.0, 16.0, None),  # Not even the first (2).
    (0.0, 0.3, 95.0, 316),
])
def test_the_largest_size_is_found_next_to_the_prediction(fit, base, per_layer, device,
                                                          largest):
  fits_at, asked = _affine_probe(base, per_layer, device)
  lo, hi = fit.largest_layers(fits_at, device)
  assert lo == largest
  assert hi == (2 if largest is None else largest + 1)
  assert len(asked) <= 4 and len(set(asked)) == len(asked)


def test_memory_that_grows_ever_less_per_layer_is_found_by_re_predicting(fit):
  """The sigma-MoE's training step on a v5p: per layer 0.985 GiB between 2 and 4 layers,
  0.94 on average up to 92. Each compile's peak (given when it fits and when it does not)
  moves the prediction: 5 compiles (2, 4, the first prediction, the next one, the size past
  the boundary), where walking one layer at a time from the first prediction took 8."""
  asked = []

  def peak(n_layers):
    return 3.456 + 0.98816 * n_layers - 0.000527 * n_layers ** 2

  def fits_at(n_layers):
    asked.append(n_layers)
    return peak(n_layers) <= 95.0, peak(n_layers)

  largest = max(n for n in range(1, 1000) if peak(n) <= 95.0)
  assert fit.largest_layers(fits_at, 95.0) == (largest, largest + 1)
  assert len(asked) <= 5 and len(set(asked)) == len(asked)


def test_a_walk_that_runs_out_of_probes_reports_its_bounds(fit):
  """Memory that grows faster than the first two sizes say: the search stops after
  MAX_PROBES compiles with true bounds, not a wrong boundary."""
  asked = []

  def fits_at(n_layers):
    asked.append(n_layers)
    peak = n_layers ** 2 * 0.01
    return (peak <= 95.0, peak if peak <= 95.0 else None)

  lo, hi = fit.largest_layers(fits_at, 95.0)
  assert len(asked) == 2 + fit.MAX_PROBES
  assert fits_at(lo)[0] and not fits_at(hi)[0] and hi - lo > 1


@pytest.mark.parametrize("text", ["tensor=0", "model=8", "fsdp=4,tensor"])
def test_a_bad_mesh_is_refused_naming_the_flag(fit, text):
  with pytest.raises(ConfigError, match="--meshes"):
    fit.parse_mesh(text)


@needs_tpu
def test_a_tiny_sparse_decoder_compiles_for_a_v5e_slice_split_or_not(fit):
  """The 17B config's sparse variant at a tiny width (8 modules of 16 heads, 64 blocks of 64
  FF units, whose weights are most of the model): `tensor=8` holds an eighth of the split
  weights, `data=8` all of them."""
  target = fit.targets.parse_target("v5e:2x4")
  rows = {}
  for mesh in ("tensor=8", "data=8"):
    config = fit.model_config("decode_sparse", 2, fit.parse_mesh(mesh))
    config.model.update(d_model=128, n_heads=16, attention_sparsity=8, vocab_size=256)
    config.model.ff.update(d_ff=4096, block_size=64)
    rows[mesh] = fit.decode_row(config, target, max_len=64)
  for row in rows.values():
    assert 0 < row["arguments_gib"] <= row["peak_gib"]
  assert rows["tensor=8"]["arguments_gib"] < rows["data=8"]["arguments_gib"] / 4
