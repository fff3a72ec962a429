"""kill -9 anywhere: `train.py` killed with SIGKILL, resumed, killed again..., ends with exactly
the parameters, optimiser state and data position of an uninterrupted run (bit for bit), for
the language model (the default config, tiny) and for fine-tuning (sparse_jax/configs/spartan_stdlib.py on
a tiny backbone).

Each run is killed first at chosen points inside its checkpoint saves (tests/fault_injection.py:
one item of a step written but not the step; every item written but the step not renamed into
place; an old step half deleted), then `--fault-kills` times (default 1, to keep the suite
quick; `python -m pytest -s tests/training/test_kill_resume.py --fault-kills=30` for a long
run) at random moments: one in five during start-up (a time drawn uniformly before
training began in the uninterrupted run), the others during training, a random time of up to
a second after a random step has been logged, with every save slowed by half a second so that
many land inside one; then it runs to the end. `-s` prints where each kill landed. All runs use
`JAX_DISABLE_MOST_OPTIMIZATIONS=1` (compile time), the reference included.
"""

import json
import os
import random
import subprocess
import sys
import time

import pytest
from training_testing import assert_trees_equal, saved_item

from sparse_jax.tasks import train_and_evaluate
from lm_testing import tiny_lm_config

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
STEPS, CKPT_EVERY = 16, 2
# (point, step) of tests/fault_injection.py's FAULT_KILL, in the order a run reaches them.
CHOSEN_KILLS = (("item", 2), ("commit", 4), ("delete", 6))

TINY_LM = [
    "--config.data.batch_size=4", "--config.data.seq_len=16", "--config.model.d_model=32",
    "--config.model.n_layers=2", "--config.model.n_heads=2", "--config.model.mem_len=16",
    "--config.model.ff.n_experts=4", "--config.model.ff.expert_size=16",
    "--config.model.dropout=0.1", "--config.model.ff.expert_dropout=0.1",
    "--config.eval.batch_size=2", "--config.eval.max_batches=1", "--config.eval.mem_len=32"]
SCHEDULE = [f"--config.train.steps={STEPS}", "--config.train.warmup_steps=2",
            "--config.train.log_every=1", f"--config.train.ckpt_every={CKPT_EVERY}",
            "--config.train.eval_every=100", "--config.train.keep_checkpoints=2"]


def _train(workdir, flags, **fault_env) -> tuple[subprocess.Popen, float]:
  env = dict(os.environ, JAX_PLATFORMS="cpu", JAX_DISABLE_MOST_OPTIMIZATIONS="1",
             **{k: str(v) for k, v in fault_env.items()})
  return subprocess.Popen(
      [sys.executable, "-m", "tests.fault_injection", "train.py", f"--workdir={workdir}",
       *flags], cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
      text=True), time.perf_counter()


def _finish(proc: subprocess.Popen) -> int:
  _, stderr = proc.communicate(timeout=600)
  assert proc.returncode in (0, -9), stderr[-4000:]
  return proc.returncode


def _in_flight(workdir) -> bool:
  """Whether a save was under way: Orbax's temporary directory of a step is left."""
  root = os.path.join(workdir, "checkpoints")
  return os.path.isdir(root) and any("tmp" in name for name in os.listdir(root))


def _wait(proc: subprocess.Popen, condition, seconds: float) -> None:
  """Until `condition()` holds, `seconds` pass or the process ends."""
  deadline = time.perf_counter() + seconds
  while proc.poll() is None and not condition() and time.perf_counter() < deadline:
    time.sleep(0.02)


def _train_lines(workdir) -> list[dict]:
  """The complete training lines of `metrics.jsonl` so far."""
  try:
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
      records = [json.loads(line) for line in f if line.endswith("\n")]
  except FileNotFoundError:
    return []
  return [r for r in records if r["split"] == "train"]


def _latest_checkpoint(workdir) -> int:
  root = os.path.join(workdir, "checkpoints")
  return max((int(n) for n in os.listdir(root) if n.isdigit()), default=0)


def kill_and_resume(workdir, flags, startup_s: float, rng: random.Random,
                    random_kills: int) -> dict:
  """The kill sequence of the module docstring; returns what happened, for the log."""
  log = {"chosen": [], "random": []}
  for point, step in CHOSEN_KILLS:
    marker = os.path.join(workdir, f"killed_{point}")
    proc, _ = _train(workdir, flags, FAULT_KILL=f"{point}@{step}", FAULT_MARKER=marker)
    assert _finish(proc) == -9, f"the {point}@{step} kill did not fire"
    assert os.path.exists(marker)
    if point != "delete":
      assert str(step) not in os.listdir(os.path.join(workdir, "checkpoints"))
    log["chosen"].append(f"{point}@{step}")
  for _ in range(random_kills):
    proc, _ = _train(workdir, flags, FAULT_SAVE_DELAY=0.5)
    done, seen = _latest_checkpoint(workdir), len(_train_lines(workdir))
    if done >= STEPS - 1 or rng.random() < 0.2:
      moment = {"start_up_s": round(rng.uniform(0, startup_s), 2)}
      _wait(proc, lambda: False, moment["start_up_s"])
    else:
      moment = {"after_step": rng.randrange(done + 1, STEPS),
                "then_s": round(rng.uniform(0, 1), 2)}
      _wait(proc, lambda: any(r["step"] >= moment["after_step"]
                              for r in _train_lines(workdir)[seen:]), 600)
      _wait(proc, lambda: False, moment["then_s"])
    proc.kill()
    log["random"].append({**moment, "killed": _finish(proc) == -9,
                          "inside_a_save": _in_flight(workdir)})
  proc, _ = _train(workdir, flags)
  assert _finish(proc) == 0
  return log


def assert_same_final_state(workdir, reference, items):
  for item in items:
    assert_trees_equal(saved_item(workdir, STEPS, item), saved_item(reference, STEPS, item))
  data = [open(os.path.join(d, "checkpoints", str(STEPS), "data", "process_0-of-1.json")).read()
          for d in (workdir, reference)]
  assert data[0] == data[1]


def reference_run(workdir, flags) -> float:
  """Runs `train.py` uninterrupted; returns the seconds until training began (metrics.jsonl
  appeared)."""
  proc, started = _train(workdir, flags)
  _wait(proc, lambda: os.path.exists(os.path.join(workdir, "metrics.jsonl")), 600)
  began = time.perf_counter() - started
  assert _finish(proc) == 0
  return began


@pytest.fixture
def random_kills(request) -> int:
  return request.config.getoption("--fault-kills")


def test_language_model_survives_sigkill_anywhere(stdlib_slice, tmp_path, random_kills):
  flags = [f"--config.data.source_root={stdlib_slice}",
           f"--config.data.data_dir={tmp_path / 'tfds'}", *TINY_LM, *SCHEDULE]
  startup_s = reference_run(tmp_path / "reference", flags)
  log = kill_and_resume(tmp_path / "killed", flags, startup_s, random.Random(0), random_kills)
  print(json.dumps(log))
  assert_same_final_state(tmp_path / "killed", tmp_path / "reference",
                          ("params", "opt_state", "memory"))


@pytest.fixture(scope="module")
def backbone(stdlib_slice, tmp_path_factory):
  root = tmp_path_factory.mktemp("kill_backbone")
  config = tiny_lm_config(stdlib_slice, str(root / "tfds"))
  config.train.update(steps=2, warmup_steps=1, ckpt_every=2, log_every=2)
  train_and_evaluate(config, str(root / "run"))
  return str(root / "run")


def test_finetuning_survives_sigkill_anywhere(backbone, tmp_path, random_kills):
  flags = ["--config=spartan_stdlib", f"--config.backbone.path={backbone}",
           "--config.task.packages=('asyncio','unittest')",
           f"--config.task.data_dir={tmp_path / 'tfds'}", "--config.task.snippet_bytes=32",
           "--config.task.max_len=32", "--config.method.spartan.n_parents=4",
           "--config.method.spartan.n_children=2", "--config.method.spartan.top_k=2",
           "--config.train.batch_size=2", "--config.eval.batch_size=4",
           "--config.eval.max_examples=4", *SCHEDULE]
  startup_s = reference_run(tmp_path / "reference", flags)
  log = kill_and_resume(tmp_path / "killed", flags, startup_s, random.Random(1), random_kills)
  print(json.dumps(log))
  assert_same_final_state(tmp_path / "killed", tmp_path / "reference",
                          ("trainable", "opt_state"))
