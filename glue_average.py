"""The sparse-jax glue-average program as a script in a checkout: sparse_jax.cli.glue_average, whose
docstring lists its commands."""

from sparse_jax.cli import glue_average

if __name__ == "__main__":
  glue_average.run()
