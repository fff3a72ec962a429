"""What a benchmark ran on, for its JSON: machine, CPUs and load, Python, JAX and devices."""

import datetime
import json
import os
import platform
import tempfile

import jax


def machine_info() -> dict:
  """The machine now (call before the measurement; `load_average_end` can be added after)."""
  return {"machine": platform.machine(), "processor": platform.processor(),
          "cpu_count": os.cpu_count(), "usable_cpus": len(os.sched_getaffinity(0)),
          "load_average": os.getloadavg(), "python": platform.python_version(),
          "jax": jax.__version__, "backend": jax.default_backend(),
          "devices": [str(d) for d in jax.devices()],
          "date": datetime.datetime.now().isoformat(timespec="seconds")}


def write_json(obj, path: str) -> None:
  """Writes `obj` as JSON into a temporary file renamed into place, so that a crash mid-write
  keeps the previous file."""
  fd, temporary = tempfile.mkstemp(dir=os.path.dirname(path) or ".", suffix=".json.incomplete")
  with os.fdopen(fd, "w", encoding="utf-8") as f:
    json.dump(obj, f, indent=2)
  os.chmod(temporary, 0o644)  # mkstemp's 0600 is for the temporary, not for the result.
  os.replace(temporary, path)


def write_result(result: dict, path: str) -> None:
  """Writes a benchmark's JSON (`write_json`), its `machine_info()` completed with the load
  at the end."""
  result["machine"]["load_average_end"] = os.getloadavg()
  write_json(result, path)
  print(f"\nwrote {path}")
