"""`python -m sparse_jax COMMAND [ARGS]`: the `sparse-jax` command (sparse_jax.cli.main)."""

from sparse_jax.cli import main

if __name__ == "__main__":
  main.main()
