"""sparse_jax: sparse Transformers in JAX/Flax."""

from sparse_jax.decoding import generate


def load(workdir: str, step: int | None = None):
  """`model, config = sparse_jax.load(workdir)`: a trained run's model, restored (eval mode).

  See `sparse_jax.tasks.runs.load`. Imported on call: the training stack (Orbax,
  TFDS, grain) loads only for users who restore runs, not for those who only use layers.
  """
  from sparse_jax.tasks import runs  # pylint: disable=import-outside-toplevel
  return runs.load(workdir, step)


__all__ = ["generate", "load"]
