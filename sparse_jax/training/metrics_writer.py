"""Training metrics: one JSON object per line in `metrics.jsonl` and TensorBoard events.

A resumed run appends to the same `metrics.jsonl`; steps it repeats (those after the
checkpoint it resumed from) appear again, and readers keep the later line. A line cut short by
a killed process is dropped when the file is opened again.
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


class MetricsWriter:
  """Appends `{"step": ..., "split": ..., **metrics}` lines and TensorBoard scalars."""

  def __init__(self, workdir: str):
    os.makedirs(workdir, exist_ok=True)
    path = os.path.join(workdir, "metrics.jsonl")
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
