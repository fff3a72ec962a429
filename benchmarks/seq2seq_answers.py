"""Where a sequence-to-sequence run's greedy answers go wrong, example by example.

    python -m benchmarks.seq2seq_answers WORKDIR [--split=test] [--examples=8] [--out=FILE]

Restores WORKDIR's latest checkpoint (`sparse_jax.tasks.runs.load`), answers the first
`--examples` of `--split` greedily (`Terraformer.greedy_decode`, as `eval.py` scores them)
and prints, per example, the lengths of the target and the answer (tokens before EOS), the
position of the first wrong token, and how much of the answer after it agrees with the target
aligned, with one target token skipped, or with one answer token repeated. This tells the ways
a model that fails beyond its training lengths can fail apart: it stops early (EOS near the
lengths it was trained on), it is wrong from the start, or it slips by a token and is right
after that. For addition it also counts the digits right where both operands have digits
(the sum needs both) apart from those past the shorter operand (there the sum is the longer
operand's digit plus a carry): a model that has learnt to copy but not to add scores near
chance (0.1) on the first and high on the second. Writes the rows as JSON.
"""

import argparse
import json

import jax
import numpy as np
from flax import nnx

from sparse_jax.data.arithmetic import EOS, SEPARATOR
from sparse_jax.tasks import task_for
from sparse_jax.tasks.runs import load


def before_eos(tokens_t: np.ndarray) -> np.ndarray:
  """The tokens before the first EOS (all of them without one)."""
  ends = np.flatnonzero(tokens_t == EOS)
  return tokens_t[:ends[0]] if ends.size else tokens_t


def _agreement(a: np.ndarray, b: np.ndarray) -> float | None:
  """The fraction of equal tokens over the shorter of `a` and `b` (None when empty)."""
  n = min(len(a), len(b))
  return float(np.mean(a[:n] == b[:n])) if n else None


def answer_errors(target_t: np.ndarray, answer_t: np.ndarray) -> dict:
  """How `answer_t` departs from `target_t` (both token ids, cut at EOS here): their lengths,
  the first position where they differ (the shorter length if one is a prefix of the other),
  and, from there on, the agreement of the answer with the target `aligned`, `skipped` (the
  target one token ahead: the answer dropped a token) and `repeated` (the answer one token
  ahead: it wrote a token twice); None where nothing is left to compare."""
  target, answer = before_eos(np.asarray(target_t)), before_eos(np.asarray(answer_t))
  n = min(len(target), len(answer))
  differ = np.flatnonzero(target[:n] != answer[:n])
  first = int(differ[0]) if differ.size else n
  return {"target_len": len(target), "answer_len": len(answer), "first_error": first,
          "aligned": _agreement(answer[first:], target[first:]),
          "skipped": _agreement(answer[first:], target[first + 1:]),
          "repeated": _agreement(answer[first + 1:], target[first:])}


def add_regions(inputs_s: np.ndarray, target_t: np.ndarray, answer_t: np.ndarray) -> dict:
  """Of an addition's answer, the digits right (in place) where both operands have digits,
  `both_right` of `both_digits` (the sum's first min(len a, len b) digits, lower-endian), and
  past the shorter operand, `longer_right` of `longer_digits`. Digits the answer lacks count
  as wrong."""
  inputs, target, answer = (before_eos(np.asarray(t)) for t in (inputs_s, target_t, answer_t))
  separator = int(np.flatnonzero(inputs == SEPARATOR)[0])
  shorter = min(separator, len(inputs) - separator - 1)
  n = min(len(target), len(answer))
  right_t = np.zeros(len(target), bool)
  right_t[:n] = target[:n] == answer[:n]
  return {"both_right": int(right_t[:shorter].sum()), "both_digits": shorter,
          "longer_right": int(right_t[shorter:].sum()), "longer_digits": len(target) - shorter}


def inspect(workdir: str, split: str, examples: int) -> list[dict]:
  """`answer_errors` (and for addition `add_regions`) of the latest checkpoint's greedy
  answers to `split`'s first `examples` examples."""
  model, config = load(workdir)
  arrays = task_for(config).data.eval_arrays(split, examples)
  inputs_bs, targets_bt = arrays["inputs"][:examples], arrays["targets"][:examples]
  graphdef, state = nnx.split(model)
  decode = jax.jit(lambda state, inputs_bs: nnx.merge(graphdef, state).greedy_decode(
      inputs_bs, targets_bt.shape[1]))
  answers_bt = np.asarray(decode(state, inputs_bs))
  rows = [answer_errors(t, a) for t, a in zip(targets_bt, answers_bt)]
  if config.data.task == "add":
    rows = [{**row, **add_regions(x, t, a)}
            for row, x, t, a in zip(rows, inputs_bs, targets_bt, answers_bt)]
  return rows


def _share(value: float | None) -> str:
  return "-" if value is None else f"{value:.2f}"


def print_table(rows: list[dict]) -> None:
  print("| example | target len | answer len | first error | aligned | skipped | repeated |")
  print("|---:|---:|---:|---:|---:|---:|---:|")
  for i, r in enumerate(rows):
    print(f"| {i} | {r['target_len']} | {r['answer_len']} | {r['first_error']} "
          f"| {_share(r['aligned'])} | {_share(r['skipped'])} | {_share(r['repeated'])} |")
  if rows and "both_digits" in rows[0]:
    for region, where in (("both", "where both operands have digits"),
                          ("longer", "past the shorter operand")):
      right, digits = (sum(r[f"{region}_{k}"] for r in rows) for k in ("right", "digits"))
      print(f"digits right {where}: {right} of {digits} ({_share(right / max(digits, 1))})")


def main(argv=None) -> list[dict]:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("workdir", help="a sequence-to-sequence run's directory")
  parser.add_argument("--split", default="test")
  parser.add_argument("--examples", type=int, default=8)
  parser.add_argument("--out", default=None, help="JSON file (default: none)")
  args = parser.parse_args(argv)
  rows = inspect(args.workdir, args.split, args.examples)
  print_table(rows)
  if args.out:
    with open(args.out, "w", encoding="utf-8") as f:
      json.dump({**vars(args), "rows": rows}, f, indent=2)
  return rows


if __name__ == "__main__":
  main()
