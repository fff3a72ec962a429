"""The `sparse-jax` command (also run as python -m sparse_jax): the package's command-line
programs, one module each in `sparse_jax.cli` whose docstring lists its commands.

  sparse-jax train --config=sigma_moe_paper:wt103_s --workdir=runs/s --config.train.steps=100
  sparse-jax eval --workdir=runs/s --split=test
  sparse-jax figures curves runs/s runs/default --metric=loss
  sparse-jax glue-average runs/rte runs/cola --mrpc=f1
  python -m sparse_jax train --config=default --workdir=runs/default

Each command imports only its own module: the absl flags of one program are not defined in
another's process.
"""

import importlib
import sys

COMMANDS = {"train": "sparse_jax.cli.train", "eval": "sparse_jax.cli.eval",
            "figures": "sparse_jax.cli.figures", "glue-average": "sparse_jax.cli.glue_average"}


def usage() -> str:
  return (f"usage: sparse-jax COMMAND [ARGS]  (COMMAND: {', '.join(COMMANDS)}; "
          "`sparse-jax COMMAND --help` lists its flags)")


def main(argv: list[str] | None = None) -> None:
  """Runs the command `argv[1]` with the rest of `argv` as its command line."""
  argv = list(sys.argv if argv is None else argv)
  if len(argv) > 1 and argv[1] in ("-h", "--help"):
    print(usage())
    return
  if len(argv) < 2 or argv[1] not in COMMANDS:
    given = f"unknown command {argv[1]!r}; " if len(argv) > 1 else ""
    sys.exit(f"sparse-jax: {given}{usage()}")
  sys.argv = [f"sparse-jax {argv[1]}", *argv[2:]]  # What absl and argparse parse.
  importlib.import_module(COMMANDS[argv[1]]).run()
