"""What a benchmark ran on, for its JSON: machine, CPUs and load, Python, JAX and devices."""

import contextlib
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


@contextlib.contextmanager
def replacing(path: str, mode: str = "w"):
  """Opens a temporary file of its own beside `path` (text `"w"` or bytes `"wb"`) and, once
  the block ends without error, renames it to `path`: a crash mid-write keeps the previous
  file, and writers side by side never share one temporary file."""
  fd, temporary = tempfile.mkstemp(dir=os.path.dirname(path) or ".",
                                   prefix=os.path.basename(path), suffix=".incomplete")
  try:
    with os.fdopen(fd, mode) as f:
      yield f
    os.chmod(temporary, 0o644)  # mkstemp's 0600 is for the temporary, not for the result.
    os.replace(temporary, path)
  except BaseException:
    os.remove(temporary)
    raise


def write_json(obj, path: str) -> None:
  """Writes `obj` as JSON by `replacing` the file at `path`."""
  with replacing(path) as f:
    json.dump(obj, f, indent=2)


def write_result(result: dict, path: str) -> None:
  """Writes a benchmark's JSON (`write_json`), its `machine_info()` completed with the load
  at the end."""
  result["machine"]["load_average_end"] = os.getloadavg()
  write_json(result, path)
  print(f"\nwrote {path}")
