"""`train.profile_steps`: a `jax.profiler` trace of exactly those steps in WORKDIR/profile, and
the field's validation; the same tiny run checks the model-FLOPs fields of every train line."""

import gzip
import json

import pytest
from cli_testing import cli_config

from sparse_jax.tasks import train_and_evaluate, validate_config
from sparse_jax.training.resume_config import check_resumable
from sparse_jax.validation import ConfigError


def traced_steps(trace_json_gz) -> list[int]:
  """The step numbers of the `train` step annotations in a Chrome/Perfetto JSON trace."""
  events = json.loads(gzip.decompress(trace_json_gz.read_bytes()))["traceEvents"]
  return sorted(int(e["args"]["step_num"]) for e in events if e.get("name") == "train")


def test_profile_of_steps_2_to_3_and_model_flops_on_every_line(tiny_config, tmp_path):
  tiny_config.train.update(steps=4, ckpt_every=4, profile_steps="1,3")
  workdir = tmp_path / "run"
  train_and_evaluate(tiny_config, str(workdir))

  runs = list((workdir / "profile" / "plugins" / "profile").iterdir())
  assert len(runs) == 1, runs
  xplanes = list(runs[0].glob("*.xplane.pb"))
  assert len(xplanes) == 1 and xplanes[0].stat().st_size > 0  # TensorBoard's profile plugin
  json_traces = list(runs[0].glob("*.json.gz"))  # perfetto_trace.json.gz, <host>.trace.json.gz
  assert any(p.name == "perfetto_trace.json.gz" for p in json_traces)
  for trace in json_traces:
    assert trace.stat().st_size > 0 and traced_steps(trace) == [1, 2]  # 0-based: steps 2, 3

  with open(workdir / "metrics.jsonl", encoding="utf-8") as f:
    train_lines = [r for r in map(json.loads, f) if r["split"] == "train"]
  assert [r["step"] for r in train_lines] == [1, 2, 3, 4]
  assert all(r["tflops_per_device"] > 0 for r in train_lines)
  assert not any("mfu" in r for r in train_lines)  # No known peak for a CPU.


@pytest.mark.parametrize("value", ["10-15", "5,5", "3,2", "0,7", (4, 2), (1, 2, 3)])
def test_bad_profile_steps_are_named(tiny_config, value):
  tiny_config.train.profile_steps = value  # train.steps is 6
  with pytest.raises(ConfigError, match=r"train\.profile_steps"):
    validate_config(tiny_config)


@pytest.mark.parametrize("value", ["0,6", " 2 , 4 ", (2, 4), [2, 4]])
def test_good_profile_steps_parse(tiny_config, value):
  tiny_config.train.profile_steps = value
  start_stop = (0, 6) if value == "0,6" else (2, 4)
  assert validate_config(tiny_config).train.profile_window == start_stop


def test_profile_steps_may_change_on_resume():
  saved, now = {"train": {"steps": 9}}, {"train": {"steps": 9, "profile_steps": "2,4"}}
  assert check_resumable(saved, now, workdir="run", step=1) == {
      "train.profile_steps": ("<absent>", "2,4")}


@pytest.mark.parametrize("config_file, flag", [
    ("default", "10,15"), ("default", "'10,15'"), ("default", "(10, 15)"),
    ("sigma_moe_paper:wt103_s", "10,15")])
def test_profile_steps_from_the_command_line(config_file, flag):
  """ml_collections reads `10,15` as a tuple where the config has no such field (the
  default), and as the string it is where the field is a string placeholder (the paper
  configs): both work."""
  config = cli_config(f"--config={config_file}", f"--config.train.profile_steps={flag}")
  assert validate_config(config).train.profile_window == (10, 15)
