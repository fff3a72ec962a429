"""A `jax.profiler` trace of a few training steps (`train.profile_steps`).

`train.profile_steps = "START,STOP"` (or `(START, STOP)`, `0 <= START < STOP <= train.steps`)
starts a trace after START steps and stops it after STOP, so the STOP - START steps logged as
START + 1 .. STOP are in it; START > 0 keeps the first step's compilation out. A resumed run
traces what is left of the window. The trace goes to `WORKDIR/profile` (with several
processes, each traces itself into `WORKDIR/profile/process_<i>`) as
`plugins/profile/<time>/<host>.xplane.pb` (TensorBoard's profile plugin: `tensorboard
--logdir WORKDIR/profile`) and `perfetto_trace.json.gz` (open in ui.perfetto.dev). Each step
is a `StepTraceAnnotation`, so the plugin's overview shows step times.
"""

import contextlib
import os
import re
from collections.abc import Callable
from typing import Any

import jax
from absl import logging

from sparse_jax.validation import ConfigError


def parse_steps(value: str | tuple[int, int] | None, path: str,
                total_steps: int) -> tuple[int, int] | None:
  """`(start, stop)` of a `profile_steps` value, or None (no profile); raises `ConfigError`
  naming `path` unless it is "START,STOP" or two integers with `0 <= START < STOP <=
  total_steps`."""
  if value is None:
    return None
  steps = value
  if isinstance(value, str):
    match = re.fullmatch(r"\s*(\d+)\s*,\s*(\d+)\s*", value)
    steps = (int(match[1]), int(match[2])) if match else None
  if steps is None or not 0 <= steps[0] < steps[1] <= total_steps:
    raise ConfigError(f"config field '{path}' must be 'START,STOP' (or a tuple of two "
                      f"integers) with 0 <= START < STOP <= train.steps={total_steps}, e.g. "
                      f"'10,15'; got {value!r}.")
  return tuple(steps)


def profile_dir(workdir: str) -> str:
  """Where this process writes its trace (module docstring)."""
  root = os.path.join(workdir, "profile")
  if jax.process_count() == 1:
    return root
  return os.path.join(root, f"process_{jax.process_index()}")


class StepProfiler:
  """Traces the steps of a `(start, stop)` window (None: none); a context manager whose exit
  stops a trace still running (an exception, a stop signal, the end of training)."""

  def __init__(self, steps: tuple[int, int] | None, workdir: str):
    self.steps, self.logdir = steps, profile_dir(workdir)
    self.tracing, self.first = False, None  # `first`: the first step traced.

  def __enter__(self) -> "StepProfiler":
    return self

  def __exit__(self, *exc) -> None:
    self._stop()

  @contextlib.contextmanager
  def step(self, step: int, outputs: Callable[[], Any]):
    """Runs training step `step` (0-based) inside the trace when it is in the window.
    `outputs()` gives the arrays the steps write (the train state): the trace starts once
    the earlier steps are done and stops once this one is, so it holds whole steps."""
    if self.steps and not self.tracing and self.steps[0] <= step < self.steps[1]:
      jax.block_until_ready(outputs())
      jax.profiler.start_trace(self.logdir, create_perfetto_trace=True)
      self.tracing, self.first = True, step
    if not self.tracing:
      yield
      return
    with jax.profiler.StepTraceAnnotation("train", step_num=step):
      yield
    if step + 1 >= self.steps[1]:
      jax.block_until_ready(outputs())
      self._stop()
      logging.info("Profile of steps %d-%d written to %s.", self.first + 1, step + 1,
                   self.logdir)

  def _stop(self) -> None:
    if self.tracing:
      self.tracing = False
      jax.profiler.stop_trace()
