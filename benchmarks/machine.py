"""What a benchmark ran on, for its JSON: machine, CPUs and load, Python, JAX and devices."""

import datetime
import os
import platform

import jax


def machine_info() -> dict:
  """The machine now (call before the measurement; `load_average_end` can be added after)."""
  return {"machine": platform.machine(), "processor": platform.processor(),
          "cpu_count": os.cpu_count(), "usable_cpus": len(os.sched_getaffinity(0)),
          "load_average": os.getloadavg(), "python": platform.python_version(),
          "jax": jax.__version__, "backend": jax.default_backend(),
          "devices": [str(d) for d in jax.devices()],
          "date": datetime.datetime.now().isoformat(timespec="seconds")}
