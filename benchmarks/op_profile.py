"""Where a compiled call's time goes, per XLA operation, read from a JAX profiler trace.

    ops = op_profile.per_op_ms(run, calls=20)  # [(op name, ms per call)], slowest first

`run()` makes one call and blocks until it is done (a closure, so that a call that donates its
buffers can feed them back). `calls` calls run under `jax.profiler.trace`; the trace is read
back with `jax.profiler.ProfileData` (no TensorBoard needed), and each XLA operation's events
are summed and divided by `calls`. On XLA:CPU an operation is a thunk named after its HLO
instruction (`dot.16`, `gather_bitcast_fusion`, `ynn_fusion.8`, ...), recorded on the XLA
threads (`tf_XLA...` lines); the runtime's own events (names with `::`) and Python's are left
out. Independent operations may run at once on different threads, so the times may add up to
more than the call's wall time. Match the names to `jitted.lower(...).compile().as_text()`.
"""

import collections
import glob
import os
import tempfile

import jax


def _xla_op_events(xplane_path: str):
  """`(name, duration_ns)` of the XLA operations recorded in one `.xplane.pb` file."""
  data = jax.profiler.ProfileData.from_file(xplane_path)
  for plane in data.planes:
    for line in plane.lines:
      if not line.name.startswith("tf_XLA"):
        continue
      for event in line.events:
        if "::" not in event.name and not event.name.startswith("end: "):
          yield event.name, event.duration_ns


def per_op_ms(run, calls: int) -> list[tuple[str, float]]:
  """Milliseconds per call of each XLA operation over `calls` traced calls of `run()`,
  slowest first. `run` should have been called once before (compilation is not profiled)."""
  if calls < 1:
    raise ValueError(f"calls must be >= 1, got {calls}.")
  with tempfile.TemporaryDirectory() as trace_dir:
    with jax.profiler.trace(trace_dir):
      for _ in range(calls):
        run()
    paths = glob.glob(os.path.join(trace_dir, "**", "*.xplane.pb"), recursive=True)
    totals_ns = collections.Counter()
    for path in paths:
      for name, duration_ns in _xla_op_events(path):
        totals_ns[name] += duration_ns
  return [(name, ns / 1e6 / calls) for name, ns in totals_ns.most_common()]
