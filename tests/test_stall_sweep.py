"""benchmarks/stall_sweep.py's bookkeeping without training: `train_to_completion` is replaced
by a stub that writes the metrics a run would, with the stall rule firing on some seeds."""

import json
import os

import numpy as np
import pytest

from benchmarks import quality_small, stall_sweep
from configs import stall_small


def _fake_train(stalled_seeds):
  """A stub of `train_to_completion`: evaluations at steps 500 and 1000, the stall flag on
  step 1000 of `stalled_seeds`; final bits per byte 2 + seed / 10."""
  calls = []

  def train(config, workdir):
    calls.append((config.model.get("embed_init", "normal"), config.seed))
    stalled = config.seed in stalled_seeds
    lines = [{"step": 1000, "split": "train", "tokens_per_second": 1000.0},
             {"step": 500, "split": "validation", "bits_per_byte": 3.0, "copy_ratio": 0.97},
             {"step": 1000, "split": "validation", "bits_per_byte": 2 + config.seed / 10,
              "copy_ratio": 0.9 if stalled else 0.5, **({"copy_stalled": 1} if stalled else {})}]
    os.makedirs(workdir, exist_ok=True)
    with open(os.path.join(workdir, "metrics.jsonl"), "w") as f:
      f.writelines(json.dumps(line) + "\n" for line in lines)
    return {"bits_per_byte": 2 + config.seed / 10, "copy_ratio": lines[-1]["copy_ratio"]}

  return train, calls


def test_stalls_are_read_from_the_runs_own_stall_rule_and_counted_per_variant(
    tmp_path, monkeypatch):
  train, calls = _fake_train(stalled_seeds={1, 3})
  monkeypatch.setattr(quality_small, "train_to_completion", train)
  args = ["--variants=baseline,xavier", "--seeds=0-3", f"--workdir={tmp_path}",
          f"--out={tmp_path / 'out.json'}"]
  result = stall_sweep.main(args)
  assert sorted(calls) == sorted([(e, s) for e in ("normal", "xavier") for s in range(4)])
  rows = {r["variant"]: r for r in result["summary"]}
  assert rows["baseline"]["stalled_seeds"] == [1, 3]
  assert rows["xavier"]["seeds"] == [0, 1, 2, 3]
  assert rows["baseline"]["bpb_not_stalled"] == pytest.approx([2.0, 2.2])
  run = next(r for r in result["runs"] if (r["variant"], r["seed"]) == ("xavier", 3))
  assert run["stalled_at"] == 1000 and run["copy_ratio"] == 0.9
  assert [e["step"] for e in run["evaluations"]] == [500, 1000]
  table = stall_sweep.format_table(result["summary"])
  bpb = [2.0, 2.1, 2.2, 2.3]
  assert f"| baseline | 2 / 4 | 1,3 | {np.mean(bpb):.3f} +- {np.std(bpb, ddof=1):.3f} |" in table
  # A second invocation reads every run back from the JSON and trains none.
  assert stall_sweep.main(args)["runs"] == result["runs"] and len(calls) == 8


def test_seed_ranges_and_unknown_variants():
  assert stall_sweep.parse_seeds("0-3,7") == [0, 1, 2, 3, 7]
  with pytest.raises(SystemExit, match="baseline"):
    stall_sweep.main(["--variants=bigger"])


def test_each_variant_changes_only_what_it_names():
  base = stall_small.get_config("baseline").to_dict()
  for name, overrides in stall_small.VARIANTS.items():
    config = stall_small.get_config(name)
    for field, value in overrides.items():
      assert config[field.split(".")[0]][field.split(".", 1)[1]] == value, (name, field)
    flat = lambda d, p="": {k: v for key, val in d.items()  # noqa: E731
                            for k, v in (flat(val, f"{p}{key}.") if isinstance(val, dict)
                                         else {f"{p}{key}": val}).items()}
    changed = {k for k, v in flat(config.to_dict()).items() if flat(base).get(k) != v}
    assert changed == {k for k in overrides if flat(base).get(k) != overrides[k]}, name
  with pytest.raises(ValueError, match="baseline"):
    stall_small.get_config("bigger")
