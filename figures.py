"""The sparse-jax figures program as a script in a checkout: sparse_jax.cli.figures, whose
docstring lists its commands."""

from sparse_jax.cli import figures

if __name__ == "__main__":
  figures.run()
