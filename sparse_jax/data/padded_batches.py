"""Padded, shuffled, resumable batches of `{"inputs", "targets"}` examples (seq2seq data).

Every seq2seq dataset (`arithmetic`, `arxiv`) yields variable-length int32 examples ending in
EOS; the model reads fixed shapes, so each is padded with PAD (0) to its split's maximum
lengths, then batched by grain, whose iterators checkpoint their position. `train_iterator`
batches any dataset of fixed-shape examples: the classification tasks' too (`task_batches`).
"""

import grain
import numpy as np

PAD = 0


def pad_example(ex: dict[str, np.ndarray], n_inputs: int, n_targets: int) -> dict:
  """`ex` with `inputs` padded to `[n_inputs]` and `targets` to `[n_targets]` with PAD."""
  def pad(tokens, length):
    return np.pad(tokens, (0, length - len(tokens)), constant_values=PAD)

  return {"inputs": pad(ex["inputs"], n_inputs), "targets": pad(ex["targets"], n_targets)}


def padded(dataset: grain.MapDataset, n_inputs: int, n_targets: int) -> grain.MapDataset:
  """`dataset`'s examples padded to `inputs [n_inputs]`, `targets [n_targets]`."""
  return dataset.map(lambda ex: pad_example(ex, n_inputs, n_targets))


def train_iterator(dataset: grain.MapDataset, *, seed: int, batch_size: int,
                   rows: slice = slice(None)) -> grain.DatasetIterator:
  """Endless batches of `dataset`'s examples (dicts of fixed-shape arrays, e.g. the padded
  `{"inputs": [B, S], "targets": [B, T]}`), reshuffled every epoch; checkpointable
  (`get_state`/`set_state`). Yields `rows` of every batch (this process's rows in a
  multi-process job), so the global batches are the same for any number of processes."""
  batches = (dataset.shuffle(seed=seed).repeat(None).batch(batch_size, drop_remainder=True)
             .map(lambda batch: {k: v[rows] for k, v in batch.items()}))
  return iter(batches.to_iter_dataset())


def stacked(dataset: grain.MapDataset, max_examples: int | None) -> dict[str, np.ndarray]:
  """The first `max_examples` (None: all) padded examples as arrays `[N, S]`, `[N, T]`."""
  n = len(dataset) if max_examples is None else min(max_examples, len(dataset))
  rows = [dataset[i] for i in range(n)]
  return {k: np.stack([row[k] for row in rows]) for k in ("inputs", "targets")}
