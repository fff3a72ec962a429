"""benchmarks/switchhead_small.py end to end at toy sizes (every variant trained for 2 steps on
a slice of the standard library, the table and the JSON, a second invocation that reads the
finished runs back), and sparse_jax/configs/switchhead_small.py's and sparse_jax/configs/moeut_small.py's variants
at their real sizes."""

import json

import pytest

from benchmarks import switchhead_small
from sparse_jax.configs import moeut_small
from sparse_jax.configs import switchhead_small as switchhead_small_config
from sparse_jax.models.accounting import attention_report, model_report

# Toy shapes per variant: (heads, head size); d_model 32 everywhere.
TINY_HEADS = {"dense": (4, 8), "switchhead": (2, 6), "dense_few": (2, 16)}


def test_variants_have_equal_parameters_at_the_real_sizes():
  configs = {v: switchhead_small_config.get_config(v) for v in switchhead_small_config.VARIANTS}
  params = {v: model_report(c.model)["total_params"] for v, c in configs.items()}
  assert max(params.values()) / min(params.values()) - 1 < 0.01, params
  dense, sh, few = (configs[v].model for v in ("dense", "switchhead", "dense_few"))
  assert dense.n_heads * dense.head_dim == few.n_heads * few.head_dim == dense.d_model
  assert (sh.attention, sh.n_heads, few.n_heads) == ("switchhead_xl", 2, 2)
  reports = {v: attention_report(c.model, c.data.seq_len) for v, c in configs.items()}
  assert (reports["switchhead"]["attention_macs_per_layer"]
          < 0.5 * reports["dense"]["attention_macs_per_layer"])
  assert switchhead_small.all_variants()[:3] == switchhead_small_config.VARIANTS
  with pytest.raises(ValueError, match="must be one of"):
    switchhead_small_config.get_config("moeut")


def test_moeut_pair_has_equal_parameters_at_the_real_sizes():
  params = {v: model_report(moeut_small.get_config(v).model)["total_params"]
            for v in moeut_small.VARIANTS}
  assert max(params.values()) / min(params.values()) - 1 < 0.001, params
  assert switchhead_small.all_variants()[3:] == moeut_small.VARIANTS


def test_benchmark_trains_each_variant_once_and_reports_them(stdlib_slice, tmp_path,
                                                             monkeypatch, capsys):
  real = switchhead_small_config.get_config

  def tiny(variant):
    config = real(variant)
    config.data.update(source_root=stdlib_slice, data_dir=str(tmp_path / "tfds"),
                       batch_size=2, seq_len=16)
    heads, head_dim = TINY_HEADS[variant]
    config.model.update(d_model=32, n_layers=1, n_heads=heads, head_dim=head_dim, mem_len=16)
    config.model.ff.d_ff = 64
    config.eval.update(batch_size=2, mem_len=16, max_batches=2)
    config.mesh.data = 1
    return config

  monkeypatch.setattr(switchhead_small, "COMPARISONS",
                      {"switchhead": (tiny, switchhead_small_config.VARIANTS)})
  out = tmp_path / "out.json"
  args = ["--seeds=0", "--steps=2", f"--workdir={tmp_path / 'runs'}", f"--out={out}"]
  first = switchhead_small.main([*args, "--step_rounds=2"])
  table = capsys.readouterr().out
  saved = json.loads(out.read_text())
  assert [r["variant"] for r in saved["runs"]] == list(switchhead_small_config.VARIANTS)
  for run in saved["runs"]:
    assert run["steps"] == 2 and run["seed"] == 0 and run["valid_bits_per_byte"] > 0
    assert run["step_ms"] > 0 and run["wall_s"] > 0 and run["resumed_after_step"] == 0
    assert run["attention_macs_per_layer"] > 0 and run["attention_memory_floats_per_layer"] > 0
    assert (tmp_path / "runs" / "switchhead" / run["variant"] / "seed0" /
            switchhead_small.RESULT_FILE).exists()
  rows = {r["variant"]: r for r in saved["summary"]}
  assert rows["dense"]["diff_percent_mean"] is None and rows["dense"]["bpb_sd"] is None
  assert rows["switchhead"]["diff_percent_mean"] is not None
  assert rows["switchhead"]["shape"]["attention_experts"] == 5
  assert len(rows["dense_few"]["wall_s"]) == 1
  # Timed side by side: the baseline's paired ratio to itself is 1 in every round.
  assert rows["dense"]["step"]["x_baseline"] == 1.0
  for row in rows.values():
    assert row["step"]["step_ms"] > 0 and row["step"]["rounds"] == 2
    assert f"{row['step']['step_ms']:.0f} | {row['step']['x_baseline']:.2f} |" in table
  for variant in switchhead_small_config.VARIANTS:
    assert f"| {variant} |" in table
  assert "attn MACs / layer" in table and "2 x 6, E 5 K 2" in table

  def not_again(config, workdir):
    raise AssertionError(f"{workdir} was trained again")

  monkeypatch.setattr(switchhead_small, "train_to_completion", not_again)
  again = switchhead_small.main([*args, "--step_rounds=0"])
  assert again["runs"] == first["runs"]
  assert {r["step"] for r in again["summary"]} == {None}
  # A finished run recorded with another config is refused, not reused.
  result = tmp_path / "runs" / "switchhead" / "dense" / "seed0" / switchhead_small.RESULT_FILE
  recorded = json.loads(result.read_text())
  assert recorded["config_fields"]["model.embed_init"] == "xavier"  # the authors' recipe
  recorded["config_fields"]["model.embed_init"] = "normal"
  result.write_text(json.dumps(recorded))
  with pytest.raises(SystemExit, match="dense seed 0 is recorded in --workdir with "
                                       "model.embed_init 'normal' \\(now 'xavier'\\)"):
    switchhead_small.main([*args, "--step_rounds=0"])
  with pytest.raises(SystemExit, match="--variants must be"):
    switchhead_small.main([*args, "--variants=bogus"])
