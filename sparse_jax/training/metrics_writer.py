"""Training metrics: one JSON object per line in `metrics.jsonl` and TensorBoard events."""

import json
import os

import tensorboardX


class MetricsWriter:
  """Appends `{"step": ..., "split": ..., **metrics}` lines and TensorBoard scalars."""

  def __init__(self, workdir: str):
    os.makedirs(workdir, exist_ok=True)
    self._jsonl = open(os.path.join(workdir, "metrics.jsonl"), "a", encoding="utf-8")
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
