"""Repeated-text probe: has a trained language model learned to copy from its context?

    python -m benchmarks.copy_probe runs/quality/quality_medium/prose_v2/dense/seed2 [...] \
        [--step=N] [--rows=16] [--half=128] [--skip=16] [--out=benchmarks/copy_probe.json]

For each run folder: its latest checkpoint (or `--step`), restored as `eval.py` restores it,
reads `--rows` sequences from an empty XL memory, each a random slice of `--half` bytes
(tokens) of the run's validation split followed by the same slice again. Bits per token on
the first copy measure ordinary prediction from a short context; on the second copy, where
every token is already in the context, a model that copies (induction heads: Olsson et al.,
2022, "In-context learning and induction heads") scores far lower. The first `--skip` targets
of each copy are left out (the first copy's have almost no context; the second copy's first
target follows the join). The same slices for every run (`--seed`). Prints a table and
writes JSON.

Why: a `quality_medium` dense seed ended 12-14% behind its twins with the same first-copy loss;
this probe tells a model that never learned to copy from one that predicts worse overall.
The scoring is `sparse_jax.tasks.copy_score`'s, which training runs also log at every
evaluation on fewer slices (`copy_ratio`, docs/training.md).
"""

import argparse

import jax.numpy as jnp
import numpy as np

from benchmarks.machine import machine_info, write_result
from sparse_jax import data
from sparse_jax.tasks.copy_score import copy_bits, copy_logits, repeated_slices
from sparse_jax.tasks.runs import saved_config, task_for


def probe(workdir: str, step: int | None, rows: int, half: int, skip: int, seed: int) -> dict:
  """`copy_bits` of `workdir`'s checkpoint `step` (None: the latest) on its validation split."""
  step, config = saved_config(workdir, step)
  task = task_for(config)
  model = task.restore_model(workdir, step)
  tokens = np.asarray(data.load_split(task.typed.data, "validation").tokens)
  x_bt = repeated_slices(tokens, rows, half, seed)
  logits_btv = copy_logits(model, jnp.asarray(x_bt), config.eval.mem_len)
  first, second = copy_bits(logits_btv, x_bt, skip)
  return {"workdir": workdir, "step": step, "first_copy_bits": first,
          "second_copy_bits": second, "second_over_first": second / first}


def format_table(results: list[dict]) -> str:
  lines = ["| run | step | first copy, bits | second copy, bits | second / first |",
           "|---|---:|---:|---:|---:|"]
  for r in results:
    lines.append(f"| {r['workdir']} | {r['step']} | {r['first_copy_bits']:.3f} | "
                 f"{r['second_copy_bits']:.3f} | {r['second_over_first']:.2f} |")
  return "\n".join(lines)


def main(argv=None) -> dict:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("workdirs", nargs="+", help="run folders with checkpoints")
  parser.add_argument("--step", type=int, default=None, help="checkpoint (default: latest)")
  parser.add_argument("--rows", type=int, default=16, help="sequences per run")
  parser.add_argument("--half", type=int, default=128, help="tokens per copy")
  parser.add_argument("--skip", type=int, default=16, help="targets left out per copy")
  parser.add_argument("--seed", type=int, default=0, help="picks the slices")
  parser.add_argument("--out", default="benchmarks/copy_probe.json")
  args = parser.parse_args(argv)
  if not 1 <= args.skip < args.half:
    parser.error(f"--skip must be in [1, --half) = [1, {args.half}); got {args.skip}")
  results = [probe(w, args.step, args.rows, args.half, args.skip, args.seed) for w in args.workdirs]
  print(format_table(results))
  result = {"machine": machine_info(), "args": vars(args), "runs": results}
  write_result(result, args.out)
  return result


if __name__ == "__main__":
  main()
