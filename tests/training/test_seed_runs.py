"""Several seeds of one config (`train.py --seeds`) and the SPARTAN paper's GLUE average."""

import json
import os
import statistics
import subprocess
import sys

import pytest

from sparse_jax.tasks import seed_runs
from sparse_jax.tasks import train_and_evaluate
from sparse_jax.validation import ConfigError
from tests.lm_testing import tiny_lm_config

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def fake_train(calls):
  """A stand-in for `train_and_evaluate` whose metrics are a known function of the seed."""

  def train(config, workdir):
    calls.append((config.seed, workdir))
    return {"step": 10, "accuracy": 0.5 + 0.1 * config.seed, "f1": 0.25 * config.seed ** 2}

  return train


def test_each_seed_trains_in_its_own_workdir_and_the_summary_is_mean_and_sample_std(tmp_path):
  calls = []
  config = tiny_lm_config("unused", "unused")
  summary = seed_runs.run_seeds(config, str(tmp_path), [1, 2, 4], fake_train(calls))
  assert calls == [(s, str(tmp_path / f"seed_{s}")) for s in (1, 2, 4)]
  assert config.seed == 0  # the caller's config is not modified
  accuracies, f1s = [0.6, 0.7, 0.9], [0.25, 1.0, 4.0]
  assert summary["mean"]["accuracy"] == pytest.approx(statistics.mean(accuracies))
  assert summary["std"]["accuracy"] == pytest.approx(statistics.stdev(accuracies))
  assert summary["std"]["f1"] == pytest.approx(statistics.stdev(f1s))
  assert "step" not in summary["mean"] and summary["task"] == "builtin"
  with open(tmp_path / "seeds.json") as f:
    assert json.load(f) == summary
  assert seed_runs.run_seeds(config, str(tmp_path / "one"), [3], fake_train([]))["std"] == {
      "accuracy": 0.0, "f1": 0.0}


def test_an_interrupted_seed_stops_without_a_summary_and_bad_seeds_are_refused(tmp_path):
  def interrupted(config, workdir):
    return {"step": 3, "interrupted": 1.0}

  config = tiny_lm_config("unused", "unused")
  assert seed_runs.run_seeds(config, str(tmp_path), [0, 1], interrupted) is None
  assert not os.path.exists(tmp_path / "seeds.json")
  for seeds in ([], [1, 1]):
    with pytest.raises(ConfigError, match="'seeds' must be one or more distinct integers"):
      seed_runs.run_seeds(config, str(tmp_path), seeds, fake_train([]))


def test_real_runs_differ_by_seed_and_a_rerun_resumes_to_the_same_summary(stdlib_slice,
                                                                           tmp_path):
  config = tiny_lm_config(stdlib_slice, str(tmp_path / "tfds"))
  config.train.update(steps=2, warmup_steps=1, ckpt_every=2)
  workdir = str(tmp_path / "runs")
  first = seed_runs.run_seeds(config, workdir, [0, 1], train_and_evaluate)
  per_seed = first["per_seed"]
  assert per_seed["0"]["bits_per_byte"] != per_seed["1"]["bits_per_byte"]
  assert os.listdir(os.path.join(workdir, "seed_1", "checkpoints"))
  again = seed_runs.run_seeds(config, workdir, [0, 1], train_and_evaluate)  # nothing to train
  assert again == first


def write_summary(path, task, per_seed):
  os.makedirs(path)
  with open(os.path.join(path, "seeds.json"), "w") as f:
    json.dump({"task": task, "seeds": list(per_seed), "per_seed": per_seed}, f)
  return str(path)


@pytest.fixture
def three_tasks(tmp_path):
  return [
      write_summary(tmp_path / "qqp", "glue/qqp", {"0": {"accuracy": 0.90, "f1": 0.1},
                                                    "1": {"accuracy": 0.92, "f1": 0.1}}),
      write_summary(tmp_path / "mrpc", "glue/mrpc", {"0": {"accuracy": 0.80, "f1": 0.90},
                                                      "1": {"accuracy": 0.84, "f1": 0.86}}),
      write_summary(tmp_path / "stsb", "glue/stsb", {"0": {"pearson": 0.9, "spearman": 0.7},
                                                      "1": {"pearson": 0.8, "spearman": 0.8}})]


def test_glue_average_uses_the_papers_scores_in_percent(three_tasks):
  result = seed_runs.glue_average(three_tasks)
  # QQP accuracy alone; MRPC accuracy; STS-B mean of Pearson and Spearman.
  seed0, seed1 = (90 + 80 + 80) / 3, (92 + 84 + 80) / 3
  assert result["tasks"]["glue/qqp"]["mean"] == pytest.approx(91)
  assert result["tasks"]["glue/mrpc"]["std"] == pytest.approx(statistics.stdev([80, 84]))
  assert result["average"] == pytest.approx((91 + 82 + 80) / 3)
  assert result["average_std"] == pytest.approx(statistics.stdev([seed0, seed1]))
  f1 = seed_runs.glue_average(three_tasks, mrpc="f1")
  assert f1["tasks"]["glue/mrpc"]["mean"] == pytest.approx(88)


def test_glue_average_refuses_missing_and_repeated_runs(three_tasks, tmp_path):
  with pytest.raises(FileNotFoundError, match="--seeds=0,1,2"):
    seed_runs.glue_average([str(tmp_path / "nothing")])
  with pytest.raises(ValueError, match="two runs of 'glue/qqp'"):
    seed_runs.glue_average([three_tasks[0], three_tasks[0]])


def test_glue_average_command_prints_the_table_and_writes_json(three_tasks, tmp_path):
  out = tmp_path / "avg.json"
  result = subprocess.run([sys.executable, "glue_average.py", *three_tasks, "--mrpc=mean",
                           f"--out={out}"], cwd=REPO, capture_output=True, text=True,
                          env=dict(os.environ, JAX_PLATFORMS="cpu"), timeout=300)
  assert result.returncode == 0, result.stderr[-2000:]
  with open(out) as f:
    written = json.load(f)
  assert written["tasks"]["glue/mrpc"]["mean"] == pytest.approx((85 + 85) / 2)
  average_line = next(line for line in result.stdout.splitlines() if line.startswith("average"))
  assert average_line.split()[1] == f"{written['average']:.2f}"
