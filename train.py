"""The sparse-jax train program as a script in a checkout: sparse_jax.cli.train, whose
docstring lists its commands."""

from sparse_jax.cli import train

if __name__ == "__main__":
  train.run()
