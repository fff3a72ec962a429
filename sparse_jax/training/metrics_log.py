"""A run's metrics log: one JSON object per line in `metrics.jsonl` (and TensorBoard events),
written by `MetricsWriter` and read back by `read_metrics` / `latest_records`.

A resumed run appends to the same `metrics.jsonl`; steps it repeats (those after the
checkpoint it resumed from) appear again, and readers keep the later line. A line cut short by
a killed process is dropped when the file is opened again. `logged_seconds` sums a run's
wall time over every invocation that trained it, from the times the loop logs
(`training.loop`).
"""

import importlib
import json
import os
import sys
from types import ModuleType


def _import_tensorboardx() -> ModuleType:
  """tensorboardX, imported as if PyTorch were not installed (unless it is imported already).

  Its writer module imports torch, when installed, only to accept torch tensors; that is
  seconds of every `train.py` start (2.4 s on our 2-core VM, most of the start-up's Python
  imports) and we write Python floats. A `None` in `sys.modules` makes `import torch` raise
  ImportError, which tensorboardX catches.
  """
  if "torch" in sys.modules:
    return importlib.import_module("tensorboardX")
  sys.modules["torch"] = None
  try:
    return importlib.import_module("tensorboardX")
  finally:
    del sys.modules["torch"]


tensorboardX = _import_tensorboardx()


METRICS_FILE = "metrics.jsonl"


class MetricsWriter:
  """Appends `{"step": ..., "split": ..., **metrics}` lines and TensorBoard scalars."""

  def __init__(self, workdir: str):
    os.makedirs(workdir, exist_ok=True)
    path = os.path.join(workdir, METRICS_FILE)
    _drop_partial_line(path)
    self._jsonl = open(path, "a", encoding="utf-8")
    self._tensorboard = tensorboardX.SummaryWriter(os.path.join(workdir, "tensorboard"))

  def write(self, step: int, split: str, metrics: dict[str, float]) -> None:
    record = {"step": step, "split": split, **{k: float(v) for k, v in metrics.items()}}
    self._jsonl.write(json.dumps(record) + "\n")
    self._jsonl.flush()
    for name, value in metrics.items():
      self._tensorboard.add_scalar(f"{split}/{name}", float(value), step)

  def close(self) -> None:
    self._jsonl.close()
    self._tensorboard.close()


def _drop_partial_line(path: str) -> None:
  """Truncates `path` after its last newline (a kill mid-write leaves a partial line)."""
  if not os.path.exists(path):
    return
  with open(path, "rb+") as f:
    data = f.read()
    if data and not data.endswith(b"\n"):
      f.truncate(data.rfind(b"\n") + 1)


def read_metrics(run_dir: str) -> list[dict]:
  """The records of `run_dir/metrics.jsonl`, in file order."""
  path = os.path.join(run_dir, METRICS_FILE)
  if not os.path.isfile(path):
    raise FileNotFoundError(f"no {METRICS_FILE} in {run_dir!r} (expected {path}); "
                            f"train.py writes it into its --workdir.")
  with open(path, encoding="utf-8") as f:
    return [json.loads(line) for line in f if line.strip()]


def latest_records(records: list[dict], split: str) -> list[dict]:
  """`split`'s records by step, the later line of a repeated step winning (a resumed run
  repeats the steps after its checkpoint)."""
  latest = {r["step"]: r for r in records if r["split"] == split}
  return [latest[step] for step in sorted(latest)]


def logged_seconds(records: list[dict], items_per_step: int) -> dict[str, float]:
  """A run's wall time over all its invocations, by part: `train` (training steps), `eval`
  and `compile` (one compilation per invocation), in seconds, and their `total`.

  Lines logged before the loop timed its parts have no `train_seconds`; their window's time
  is recovered from its rate (`items_per_step` times its steps over the `*_per_second`
  value), and then includes the evaluations and saves made during it.
  """
  parts = {"train": 0.0, "eval": 0.0, "compile": 0.0}
  previous_step = 0
  for record in latest_records(records, "train"):
    if "train_seconds" in record:
      parts["train"] += record["train_seconds"]
    else:
      rate = next(v for k, v in record.items() if k.endswith("_per_second"))
      parts["train"] += items_per_step * (record["step"] - previous_step) / rate
    parts["compile"] += record.get("compile_seconds", 0.0)
    previous_step = record["step"]
  parts["eval"] = sum(r.get("eval_seconds", 0.0) for r in latest_records(records, "validation"))
  return {**parts, "total": sum(parts.values())}
