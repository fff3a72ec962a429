"""Batches of tokenized classification examples, through grain.

A split is held as arrays `tokens [N, T] int32`, `lengths [N] int32`, `labels [N]`. Training
reads endless shuffled epochs (a checkpointable grain iterator, so a resumed run continues
with the batches it would have seen); evaluation reads the split once in order, the last batch
padded by repeating row 0 and marked in `weights`.
"""

import grain
import numpy as np

from sparse_jax.data import padded_batches


class TaskRows:
  """A grain random-access source over equally long arrays: element i is `{k: v[i]}`."""

  def __init__(self, arrays: dict[str, np.ndarray]):
    sizes = {len(v) for v in arrays.values()}
    if len(sizes) != 1 or not sizes.pop():
      raise ValueError(f"TaskRows needs non-empty arrays of one length; got "
                       f"{ {k: v.shape for k, v in arrays.items()} }.")
    self._arrays = arrays

  def __len__(self) -> int:
    return len(next(iter(self._arrays.values())))

  def __getitem__(self, i: int) -> dict[str, np.ndarray]:
    return {k: v[i] for k, v in self._arrays.items()}

  def __repr__(self) -> str:
    return f"TaskRows(n={len(self)}, fields={sorted(self._arrays)})"


def train_iterator(arrays: dict[str, np.ndarray], batch_size: int, seed: int,
                   rows: slice = slice(None)) -> grain.DatasetIterator:
  """Endless batches of `batch_size` rows, reshuffled every epoch; `get_state`/`set_state`
  (`padded_batches.train_iterator`). Yields `rows` of every batch (in a multi-process job,
  the rows this process's devices hold)."""
  return padded_batches.train_iterator(grain.MapDataset.source(TaskRows(arrays)), seed=seed,
                                       batch_size=batch_size, rows=rows)


def eval_batches(arrays: dict[str, np.ndarray], batch_size: int):
  """One ordered pass in batches of `batch_size`; `weights` is 0 on the last batch's padding."""
  n = len(TaskRows(arrays))
  for start in range(0, n, batch_size):
    index = np.arange(start, start + batch_size)
    real = index < n
    batch = {k: v[np.where(real, index, 0)] for k, v in arrays.items()}
    yield {**batch, "weights": real.astype(np.float32)}
