"""The papers' figures from run directories and benchmark JSON: one subcommand each, writing
`<out>/<name>.png` and the numbers behind it, `<out>/<name>.json`.

  sparse-jax figures channels runs/dense            # sigma-MoE Fig. 1/3/4: active channels of u
  sparse-jax figures experts runs/moe --layer=2     # Fig. 5: co-occurrence; usage per layer
  sparse-jax figures attention_experts runs/sh --layer=0  # SwitchHead: expert usage per head
  sparse-jax figures cvmm benchmarks/cvmm_*.json    # Fig. 2/6/7: time and memory of one layer
  sparse-jax figures cells runs/spartan_stdlib      # SPARTAN Fig. 2: parent cells by class
  sparse-jax figures curves runs/a runs/b --metric=loss   # learning curves of several runs
"""

import argparse
import sys

from sparse_jax.figures import (attention_routing, channel_activity, cvmm_scaling,
                                expert_routing, learning_curves, spartan_cells)
from sparse_jax.training.checkpointing import NoCheckpointError


def _splits(text: str) -> tuple[str, ...]:
  return tuple(text.split(","))


def _parser() -> argparse.ArgumentParser:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  commands = parser.add_subparsers(dest="figure", required=True)

  def command(name, help_text, inputs, nargs=None):
    sub = commands.add_parser(name, help=help_text)
    sub.add_argument(inputs, nargs=nargs)
    sub.add_argument("--out", default="figures", help="Output directory (default: figures).")
    sub.add_argument("--name", default=None, help="File name without extension.")
    return sub

  sub = command("channels", "active channels of u per layer (dense LM run)", "workdir")
  sub.add_argument("--splits", type=_splits, default=("validation", "test"))
  sub.add_argument("--max_batches", type=int, default=8, help="Segments per split.")
  sub = command("experts", "expert co-occurrence and usage (MoE LM run)", "workdir")
  sub.add_argument("--layer", type=int, default=2, help="0-based block for co-occurrence.")
  sub.add_argument("--splits", type=_splits, default=("validation",))
  sub.add_argument("--max_batches", type=int, default=8, help="Segments per split.")
  sub = command("attention_experts", "V and O expert usage per head (SwitchHead LM run)",
                "workdir")
  sub.add_argument("--layer", type=int, default=0, help="0-based layer (depth).")
  sub.add_argument("--step", type=int, default=None, help="Checkpoint step (default: latest).")
  sub.add_argument("--splits", type=_splits, default=("validation",))
  sub.add_argument("--max_batches", type=int, default=8, help="Segments per split.")
  command("cvmm", "time and memory vs the swept size (benchmarks/cvmm.py JSON)", "json_paths",
          nargs="+")
  sub = command("cells", "SPARTAN parent cells by class (classification run)", "workdir")
  sub.add_argument("--split", default="validation")
  sub.add_argument("--max_examples", type=int, default=512)
  sub = command("curves", "learning curves of runs (their metrics.jsonl)", "run_dirs",
                nargs="+")
  sub.add_argument("--metric", default="loss")
  return parser


def _make(args) -> dict[str, str]:
  named = {"name": args.name} if args.name else {}
  if args.figure == "channels":
    return channel_activity.make_channel_activity(
        args.workdir, args.out, splits=args.splits, max_batches=args.max_batches, **named)
  if args.figure == "experts":
    return expert_routing.make_expert_routing(
        args.workdir, args.out, layer=args.layer, splits=args.splits,
        max_batches=args.max_batches, **named)
  if args.figure == "attention_experts":
    return attention_routing.make_attention_routing(
        args.workdir, args.out, layer=args.layer, step=args.step, splits=args.splits,
        max_batches=args.max_batches, **named)
  if args.figure == "cvmm":
    return cvmm_scaling.make_cvmm_scaling(args.json_paths, args.out, **named)
  if args.figure == "cells":
    return spartan_cells.make_spartan_cells(
        args.workdir, args.out, split=args.split, max_examples=args.max_examples, **named)
  return learning_curves.make_learning_curves(args.run_dirs, args.out, metric=args.metric,
                                              **named)


def main(argv=None) -> None:
  args = _parser().parse_args(argv)
  try:
    paths = _make(args)
  except (NoCheckpointError, FileNotFoundError, ValueError) as e:
    sys.exit(f"figures.py {args.figure}: {e}")
  print(f"wrote {paths['png']} and {paths['json']}")


def run() -> None:
  """`sparse-jax figures`: the command line is `sys.argv`."""
  main()


if __name__ == "__main__":
  run()
