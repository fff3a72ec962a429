"""Helpers shared by the training tests: reading logged losses, wrapping the train step, a
free port for multi-process runs."""

import json
import os
import signal
import socket

from sparse_jax.training import loop


def train_losses(workdir) -> dict[int, float]:
  """The logged training loss of every step (log_every=1) from `workdir/metrics.jsonl`."""
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    records = [json.loads(line) for line in f]
  return {r["step"]: r["loss"] for r in records if r["split"] == "train"}


def patch_step(monkeypatch, after_step):
  """Wraps the jitted train step; `after_step(step_index, outputs)` may alter its outputs."""
  real = loop.make_train_step

  def patched(*args, **kwargs):
    step_fn = real(*args, **kwargs)

    def wrapped(state, carry, batch, step_index):
      return after_step(step_index, step_fn(state, carry, batch, step_index))

    return wrapped

  monkeypatch.setattr(loop, "make_train_step", patched)


def sigterm_at(stop_index):
  """An `after_step` for `patch_step` that sends this process SIGTERM during step
  `stop_index` (0-based), so the run saves and stops after it."""

  def after_step(step_index, outputs):
    if step_index == stop_index:
      os.kill(os.getpid(), signal.SIGTERM)
    return outputs

  return after_step


def free_port() -> int:
  """A TCP port on localhost that nothing listens on (for a multi-process coordinator)."""
  with socket.socket() as s:
    s.bind(("localhost", 0))
    return s.getsockname()[1]
