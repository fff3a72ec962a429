"""The sparse-jax eval program as a script in a checkout: sparse_jax.cli.eval, whose
docstring lists its commands."""

from sparse_jax.cli import eval

if __name__ == "__main__":
  eval.run()
