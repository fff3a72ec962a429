"""sparse_jax: sparse Transformers in JAX/Flax."""

from sparse_jax.decoding import generate

# The package's version, written only here (pyproject.toml reads it); CHANGELOG.md has each one.
__version__ = "0.1.0"


def load(workdir: str, step: int | None = None):
  """`model, config = sparse_jax.load(workdir)`: a trained run's model, restored (eval mode).

  See `sparse_jax.tasks.runs.load`. Imported on call: the training stack (Orbax,
  TFDS, grain) loads only for users who restore runs, not for those who only use layers.
  """
  from sparse_jax.tasks import runs  # pylint: disable=import-outside-toplevel
  return runs.load(workdir, step)


__all__ = ["__version__", "generate", "load"]
