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
"""

import argparse
import math

import jax
import jax.numpy as jnp
import numpy as np
import optax

from benchmarks.machine import machine_info, write_result
from sparse_jax import data
from sparse_jax.tasks.runs import saved_config, task_for


def repeated_slices(tokens: np.ndarray, rows: int, half: int, seed: int) -> np.ndarray:
  """`[rows, 2 * half]`: random slices of `tokens`, each followed by itself."""
  if len(tokens) < half:
    raise ValueError(f"--half={half} is longer than the split ({len(tokens)} tokens)")
  starts = np.random.default_rng(seed).integers(0, len(tokens) - half + 1, rows)
  return np.stack([np.tile(tokens[s:s + half], 2) for s in starts])


def copy_bits(logits_btv: jax.Array, x_bt: np.ndarray, skip: int) -> tuple[float, float]:
  """Mean bits per token of the first and the second copy in `x_bt` (`repeated_slices`),
  leaving out each copy's first `skip` targets. `logits_btv` are the predictions for
  `x_bt[:, 1:]` from `x_bt[:, :-1]`; target `j` of a copy is predicted at position `j - 1`."""
  half = x_bt.shape[1] // 2
  nll_bt = np.asarray(optax.softmax_cross_entropy_with_integer_labels(
      jnp.asarray(logits_btv, jnp.float32), jnp.asarray(x_bt[:, 1:])))
  first = nll_bt[:, skip - 1:half - 1]
  second = nll_bt[:, half + skip - 1:]
  return float(first.mean() / math.log(2)), float(second.mean() / math.log(2))


def probe(workdir: str, step: int | None, rows: int, half: int, skip: int, seed: int) -> dict:
  """`copy_bits` of `workdir`'s checkpoint `step` (None: the latest) on its validation split."""
  step, config = saved_config(workdir, step)
  task = task_for(config)
  model = task.restore_model(workdir, step)
  tokens = np.asarray(data.load_split(task.typed.data, "validation").tokens)
  x_bt = repeated_slices(tokens, rows, half, seed)
  memory = model.init_memory(rows, config.eval.mem_len)
  logits_btv, _, _ = model(jnp.asarray(x_bt[:, :-1]), memory)
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
