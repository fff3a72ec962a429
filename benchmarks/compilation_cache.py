"""What the persistent compilation cache saves: `train.py` run twice on one config, each in a
fresh workdir, against one fresh cache directory; the step's compile seconds of each run (the
`compile_seconds` of its first logged line: trace, lower and compile of the training step).

    python -m benchmarks.compilation_cache [--json PATH] [-- TRAIN_PY_FLAGS...]

The first run compiles and fills the cache, the second loads the step from it (tracing and
lowering still run), so it adds no entry. Default: `python train.py`'s embedded default, two
steps. What JAX keeps follows its settings (`JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS`,
default 1 s) in the environment.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

from benchmarks import machine

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STEPS = ["--config.train.steps=2", "--config.train.log_every=1", "--config.train.eval_every=2",
         "--config.train.ckpt_every=2"]


def compile_seconds(train_flags: list[str], workdir: str, cache: str) -> float:
  """The training step's compile seconds of one `train.py` run (a subprocess)."""
  done = subprocess.run([sys.executable, "train.py", f"--workdir={workdir}",
                         f"--compilation_cache={cache}", *STEPS, *train_flags],
                        cwd=REPO, capture_output=True, text=True, check=False)
  if done.returncode:
    sys.exit(f"train.py failed:\n{done.stderr[-3000:]}")
  with open(os.path.join(workdir, "metrics.jsonl"), encoding="utf-8") as f:
    return next(json.loads(line)["compile_seconds"] for line in f if "compile_seconds" in line)


def main(argv: list[str] | None = None) -> dict:
  argv = sys.argv[1:] if argv is None else argv
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--json", default=None, help="where to write the report")
  parser.add_argument("train_flags", nargs=argparse.REMAINDER,
                      help="after --: flags for train.py (config overrides)")
  args = parser.parse_args(argv)
  train_flags = args.train_flags[1:] if args.train_flags[:1] == ["--"] else args.train_flags
  with tempfile.TemporaryDirectory() as scratch:
    cache = os.path.join(scratch, "cache")
    cold = compile_seconds(train_flags, os.path.join(scratch, "cold"), cache)
    entries_cold = len(os.listdir(cache))
    warm = compile_seconds(train_flags, os.path.join(scratch, "warm"), cache)
    entries_warm = len(os.listdir(cache))
  report = {"train_flags": train_flags, "cold_compile_s": cold, "warm_compile_s": warm,
            "cache_entries": {"after_cold": entries_cold, "after_warm": entries_warm},
            "machine": machine.machine_info(),
            "command": " ".join(["python -m benchmarks.compilation_cache", *argv])}
  print("| train.py flags | compile s, cold cache | compile s, warm cache | cold / warm |\n"
        "|---|---:|---:|---:|\n"
        f"| {' '.join(train_flags) or '(the embedded default)'} | {cold:.2f} | {warm:.2f} | "
        f"{cold / warm:.1f}x |")
  if args.json:
    with open(args.json, "w", encoding="utf-8") as f:
      json.dump(report, f, indent=1)
  return report


if __name__ == "__main__":
  main()
