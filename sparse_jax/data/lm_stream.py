"""Transformer-XL batches: `batch_size` contiguous streams read one segment at a time.

A split's tokens are cut into `B` equal contiguous streams (`[B, L]`, the tail that does not
fill a stream is dropped). Step t reads segment t of every stream, `tokens[:, tS : tS + S + 1]`,
whose first S columns are the inputs and last S the targets, so the memory carried from step
t - 1 holds the real preceding text of each stream.

With several processes, each reads only its own block of streams (a grain `ShardOptions`:
shard i of n holds streams `[i B / n, (i + 1) B / n)`), so the global batch is the same for
any number of processes.
"""

import grain
import numpy as np


class StreamSegments:
  """A grain random-access source: element t is segment t of every stream, `[B, S + 1]`.

  With `shard`, element t holds only that shard's streams, `[B / shard_count, S + 1]`.
  """

  def __init__(self, tokens: np.ndarray, batch_size: int, seq_len: int,
               shard: grain.sharding.ShardOptions | None = None):
    stream_len = len(tokens) // batch_size
    n_segments = (stream_len - 1) // seq_len
    if n_segments < 1:
      raise ValueError(
          f"a split of {len(tokens)} tokens is too short for batch_size={batch_size} streams "
          f"of at least seq_len + 1 = {seq_len + 1} tokens each.")
    self._streams_bl = tokens[:batch_size * stream_len].reshape(batch_size, stream_len)
    if shard is not None:
      self._streams_bl = self._streams_bl[_shard_rows(batch_size, shard)]
    self._seq_len = seq_len
    self._n_segments = n_segments

  def __len__(self) -> int:
    return self._n_segments

  def __getitem__(self, t: int) -> dict[str, np.ndarray]:
    start = t * self._seq_len
    window_bs = self._streams_bl[:, start:start + self._seq_len + 1].astype(np.int32)
    return {"inputs": window_bs[:, :-1], "targets": window_bs[:, 1:]}

  def __repr__(self) -> str:
    b, l = self._streams_bl.shape
    return f"StreamSegments(streams={b}, stream_len={l}, seq_len={self._seq_len})"


def _shard_rows(batch_size: int, shard: grain.sharding.ShardOptions) -> slice:
  if batch_size % shard.shard_count:
    raise ValueError(f"batch_size={batch_size} streams do not split into "
                     f"{shard.shard_count} equal shards.")
  per_shard = batch_size // shard.shard_count
  return slice(shard.shard_index * per_shard, (shard.shard_index + 1) * per_shard)


def train_iterator(tokens: np.ndarray, batch_size: int, seq_len: int,
                   shard: grain.sharding.ShardOptions | None = None) -> grain.DatasetIterator:
  """Endless epochs over the segments in stream order; `get_state`/`set_state` checkpointable."""
  source = StreamSegments(tokens, batch_size, seq_len, shard)
  return iter(grain.MapDataset.source(source).repeat(None).to_iter_dataset())


def eval_batches(tokens: np.ndarray, batch_size: int, seq_len: int,
                 max_batches: int | None = None,
                 shard: grain.sharding.ShardOptions | None = None
                 ) -> list[dict[str, np.ndarray]]:
  """The segments of one pass in order (the first `max_batches` if given)."""
  source = StreamSegments(tokens, batch_size, seq_len, shard)
  n = len(source) if max_batches is None else min(len(source), max_batches)
  return [source[t] for t in range(n)]
