"""benchmarks/stall_sweep.py's bookkeeping and stall criterion without training:
`train_to_completion` is replaced by a stub that writes the evaluations a run would."""

import json
import os

import numpy as np
import pytest

from benchmarks import quality_small, stall_sweep
from sparse_jax.configs import stall_medium

# (step, copy ratio) of a run that stalls (still copying hardly at all at step 1000, < 0.1 less
# than at step 500) and of one that learns to copy.
STALLED = [(250, 0.99), (500, 0.97), (750, 0.95), (1000, 0.90)]
HEALTHY = [(250, 0.99), (500, 0.97), (750, 0.80), (1000, 0.50)]


def _fake_train(stalled_seeds):
  """A stub of `train_to_completion`: `STALLED` or `HEALTHY` evaluations, the training's
  warning at step 1000 of the stalled ones; bits per byte at the last step 2 + seed / 10, and
  5% more for sigma-MoE."""
  calls = []

  def train(config, workdir):
    calls.append((config.model.get("embed_init", "normal"), config.seed))
    history = STALLED if config.seed in stalled_seeds else HEALTHY
    bpb = (2 + config.seed / 10) * (1.05 if config.model.ff.kind == "sigma_moe" else 1)
    lines = [{"step": 1000, "split": "train", "tokens_per_second": 1000.0}]
    lines += [{"step": step, "split": "validation", "bits_per_byte": bpb, "copy_ratio": ratio,
               **({"copy_stalled": 1} if step == 1000 and history is STALLED else {})}
              for step, ratio in history]
    os.makedirs(workdir, exist_ok=True)
    with open(os.path.join(workdir, "metrics.jsonl"), "w") as f:
      f.writelines(json.dumps(line) + "\n" for line in lines)
    return {"bits_per_byte": bpb, "copy_ratio": history[-1][1]}

  return train, calls


def test_stalls_are_counted_per_model_and_change(tmp_path, monkeypatch):
  train, calls = _fake_train(stalled_seeds={1, 3})
  monkeypatch.setattr(quality_small, "train_to_completion", train)
  args = ["--models=dense", "--changes=baseline,fan_in", "--seeds=0-3", f"--workdir={tmp_path}",
          f"--out={tmp_path / 'out.json'}"]
  result = stall_sweep.main(args)
  assert sorted(calls) == sorted([(e, s) for e in ("normal", "fan_in") for s in range(4)])
  assert (tmp_path / "stall_medium" / "builtin" / "dense" / "fan_in" / "seed3").is_dir()
  rows = {r["variant"]: r for r in result["summary"]}
  assert rows["dense/baseline"]["stalled_seeds"] == [1, 3]
  run = next(r for r in result["runs"] if (r["variant"], r["seed"]) == ("dense/fan_in", 3))
  assert run["stalled_at"] == 1000 and run["copy_ratio"] == 0.9
  assert [e["step"] for e in run["evaluations"]] == [250, 500, 750, 1000]
  table = stall_sweep.format_table(result["summary"])
  bpb = [2.0, 2.1, 2.2, 2.3]
  assert (f"| builtin | dense/fan_in | 2 / 4 | 1,3 | {np.mean(bpb):.3f} +- "
          f"{np.std(bpb, ddof=1):.3f} |" in table)
  # A second invocation reads every run back from the JSON and trains none.
  assert stall_sweep.main(args)["runs"] == result["runs"] and len(calls) == 8


def test_a_prose_sweep_is_kept_apart_from_the_builtin_one(tmp_path, monkeypatch):
  """The same (variant, seed) on the two corpora: two runs, two folders, two summary rows."""
  from benchmarks import prose_corpus
  docs = tmp_path / "doc"
  docs.mkdir()
  for i in range(60):
    (docs / f"f{i}.txt").write_text(f"text {i}\n\n")
  monkeypatch.setattr(prose_corpus, "SOURCE_GLOB", str(docs / "*.txt"))
  train, calls = _fake_train(stalled_seeds={1})
  monkeypatch.setattr(quality_small, "train_to_completion", train)
  args = ["--models=dense", "--changes=baseline", "--seeds=1", f"--workdir={tmp_path}",
          f"--out={tmp_path / 'out.json'}"]
  stall_sweep.main(args)
  result = stall_sweep.main(args + ["--corpus=prose"])
  assert len(calls) == 2
  assert (tmp_path / "stall_medium" / prose_corpus.CORPUS_ID / "dense" / "baseline" /
          "seed1").is_dir()
  assert [(r["corpus"], r["variant"], r["stalled_seeds"]) for r in result["summary"]] == [
      ("builtin", "dense/baseline", [1]), ("prose", "dense/baseline", [1])]
  assert "| prose | dense/baseline | 1 / 1 | 1 |" in stall_sweep.format_table(result["summary"])


def test_the_criterion_is_the_stall_rule_over_quality_mediums_warm_up():
  evals = lambda history: [{"step": s, "copy_ratio": r} for s, r in history]  # noqa: E731
  assert stall_sweep.stalled_at(evals(STALLED)) == 1000
  assert stall_sweep.stalled_at(evals(HEALTHY)) is None
  # Fell by 0.1 or more since step 500: started to copy, though still above 0.8.
  assert stall_sweep.stalled_at(evals([(500, 0.97), (1000, 0.85)])) is None
  # Not judged before an evaluation at least the warm-up's length past the warm-up's end.
  assert stall_sweep.stalled_at(evals([(250, 0.99), (500, 0.99), (750, 0.99)])) is None


def test_seed_ranges_and_unknown_models_and_changes():
  assert stall_sweep.parse_seeds("0-3,7") == [0, 1, 2, 3, 7]
  with pytest.raises(SystemExit, match="baseline"):
    stall_sweep.main(["--changes=bigger"])
  with pytest.raises(SystemExit, match="sigma_moe"):
    stall_sweep.main(["--models=switch"])


def _flat(d: dict, prefix: str = "") -> dict:
  out = {}
  for key, value in d.items():
    out.update(_flat(value, f"{prefix}{key}.") if isinstance(value, dict)
               else {f"{prefix}{key}": value})
  return out


@pytest.mark.parametrize("model", ["dense", "sigma_moe"])
def test_each_change_changes_only_what_it_names(model):
  base = _flat(stall_medium.get_config(f"{model}/baseline").to_dict())
  for change, overrides in stall_medium.CHANGES.items():
    config = _flat(stall_medium.get_config(f"{model}/{change}").to_dict())
    assert {k: config[k] for k in overrides} == overrides, change
    assert {k for k in config if base.get(k) != config[k]} == {
        k for k in overrides if base.get(k) != overrides[k]}, change
  with pytest.raises(ValueError, match="baseline"):
    stall_medium.get_config(f"{model}/bigger")


def test_the_probe_trains_quality_mediums_first_quarter_on_its_schedule():
  """The recipe studied: `quality_medium` as the stalled runs trained it, with the N(0, 1)
  token embedding that was the default before the fix; the fix is now the default."""
  from sparse_jax.configs import quality_medium
  from sparse_jax.tasks.selection import validate_config
  probe, full = stall_medium.get_config("dense/baseline"), quality_medium.get_config("dense")
  assert (probe.train.steps, probe.train.schedule_steps) == (1000, full.train.steps)
  assert probe.train.warmup_steps == full.train.warmup_steps
  probe_model, full_model = (validate_config(c).to_dict()["model"] for c in (probe, full))
  assert (probe_model.pop("embed_init"), full_model.pop("embed_init")) == ("normal", "fan_in")
  assert probe_model == full_model
  assert probe.data.to_dict() == full.data.to_dict()


def test_the_probe_records_recipes_of_joined_changes(tmp_path, monkeypatch):
  train, calls = _fake_train(stalled_seeds={0})
  monkeypatch.setattr(quality_small, "train_to_completion", train)
  out = tmp_path / "study.json"
  result = stall_sweep.main(["--models=sigma_moe",
                             "--changes=baseline,fan_in+residual_zero", "--seeds=0-1",
                             f"--workdir={tmp_path}", f"--out={out}"])
  assert sorted(calls) == sorted([(e, s) for e in ("normal", "fan_in") for s in (0, 1)])
  assert (tmp_path / "stall_medium" / "builtin" / "sigma_moe" / "fan_in+residual_zero" /
          "seed1").is_dir()
  runs = {(r["recipe"], r["seed"]): r for r in json.loads(out.read_text())["runs"]}
  assert runs["baseline", 0]["stalled"] is True and runs["baseline", 1]["stalled"] is False
  joined = runs["fan_in+residual_zero", 1]
  assert joined["model"] == "sigma_moe" and joined["steps"] == stall_medium.STEPS
  assert joined["config_fields"]["model.embed_init"] == "fan_in"
  assert joined["config_fields"]["model.residual_init_scale"] == 0.0
  assert joined["warned"] is False and runs["baseline", 0]["warned"] is True
  assert result["alarms"] == {"runs": 4, "false": [], "missed": []}
  # Both models on the same seeds: sigma-MoE's 5% is the paired difference of every seed.
  result = stall_sweep.main(["--models=dense",
                             "--changes=baseline,fan_in+residual_zero", "--seeds=0-1",
                             f"--workdir={tmp_path}", f"--out={out}"])
  assert [(r["recipe"], r["seeds"]) for r in result["paired"]] == [
      ("baseline", [0, 1]), ("fan_in+residual_zero", [0, 1])]
  for row in result["paired"]:
    np.testing.assert_allclose(row["diff_percent"], [5.0, 5.0])
  assert "| builtin | baseline | 2 | +5.00 +- 0.00 |" in stall_sweep.format_paired(
      result["paired"])
  assert "| builtin | sigma_moe/baseline | 1 / 2 | 0 | 2.152 +- 0.074 | 2.205 |" in (
      stall_sweep.format_table(result["summary"]))
  with pytest.raises(SystemExit, match="unknown change 'bigger'"):
    stall_sweep.main(["--changes=fan_in+bigger"])
  with pytest.raises(SystemExit, match="twice"):
    stall_sweep.main(["--changes=fan_in+xavier"])


@pytest.mark.parametrize("model", ["dense", "sigma_moe"])
def test_changes_join_into_recipes(model):
  joined = _flat(stall_medium.get_config(f"{model}/lr_half+residual_zero").to_dict())
  assert (joined["train.lr"], joined["model.residual_init_scale"]) == (5e-4, 0.0)


def test_the_default_probe_trains_python_train_pys_run_under_each_recipe(tmp_path, monkeypatch):
  """`--probe=default`: the embedded default (or its dense twin) as `python train.py` trains
  it, with the recipe studied and the recipe's changes set; too short to be judged, so a
  stalled-looking history counts as neither a stall nor, without the warning, an alarm."""
  from sparse_jax.configs import default, default_dense
  from sparse_jax.tasks.selection import validate_config
  configs = []
  train, _ = _fake_train(stalled_seeds=set())
  monkeypatch.setattr(quality_small, "train_to_completion",
                      lambda config, workdir: (configs.append(config), train(config, workdir))[1])
  result = stall_sweep.main(["--probe=default", "--models=dense,sigma_moe",
                             "--changes=fan_in+residual_zero", "--seeds=0",
                             f"--workdir={tmp_path}", f"--out={tmp_path / 'default.json'}"])
  for config in configs:
    full = default.get_config() if config.model.ff.kind == "sigma_moe" else (
        default_dense.get_config())
    full.model.update(embed_init="fan_in", residual_init_scale=0.0)
    assert validate_config(config).to_dict() == validate_config(full).to_dict()
  assert {r["steps"] for r in result["runs"]} == {400}
  assert (tmp_path / "default" / "builtin" / "dense" / "fan_in+residual_zero" / "seed0").is_dir()
  assert result["alarms"] == {"runs": 2, "false": [], "missed": []}
