"""The `builtin` TFDS builder and the contiguous-stream batches."""

import os
import shutil

import grain
import ml_collections
import numpy as np
import pytest

from sparse_jax import data
from sparse_jax.data import builtin
from sparse_jax.data.lm_stream import StreamSegments, eval_batches, train_iterator

# The stream fields every `data` section has (not used by these dataset-level calls).
STREAMS = dict(batch_size=2, seq_len=16)


def make_tree(root, files: dict[str, bytes]) -> None:
  for path, content in files.items():
    os.makedirs(os.path.dirname(os.path.join(root, path)) or root, exist_ok=True)
    with open(os.path.join(root, path), "wb") as f:
      f.write(content)


@pytest.fixture(scope="module")
def fake_stdlib(tmp_path_factory):
  rng = np.random.default_rng(0)
  files = {f"pkg{i % 7}/mod_{i}.py": rng.integers(32, 127, size=50 + i).astype(np.uint8).tobytes()
           for i in range(120)}
  skipped = {"site-packages/third_party.py": b"x", "pkg0/__pycache__/mod_0.py": b"y",
             "pkg0/notes.txt": b"z"}
  root = str(tmp_path_factory.mktemp("fake_stdlib"))
  make_tree(root, {**files, **skipped})
  return root, files


def read_split(cfg, split):
  b = data.spec(cfg).make_builder()
  b.download_and_prepare()
  source = b.as_data_source(split)
  return [(source[i]["path"].decode(), bytes(np.asarray(source[i]["bytes"])))
          for i in range(len(source))]


def test_builder_keeps_every_file_once_in_order(fake_stdlib, tmp_path):
  root, files = fake_stdlib
  cfg = ml_collections.ConfigDict(dict(name="builtin", source_root=root,
                                       data_dir=str(tmp_path), **STREAMS))
  seen = {}
  for split in data.SPLITS:
    records = read_split(cfg, split)
    paths = [p for p, _ in records]
    assert paths == sorted(paths), "records must keep the source order (no shuffling)"
    for path, content in records:
      assert path not in seen
      seen[path] = content
    joined = np.concatenate([np.frombuffer(c, np.uint8) for _, c in records])
    np.testing.assert_array_equal(data.load_tokens(cfg, split), joined)
  assert seen == files  # skipped dirs and non-.py files are absent, content is exact


def test_split_depends_only_on_relative_path(fake_stdlib, tmp_path):
  root, files = fake_stdlib
  moved = str(tmp_path / "elsewhere" / "lib")
  shutil.copytree(root, moved)
  for split in data.SPLITS:
    a = read_split(ml_collections.ConfigDict(
        dict(name="builtin", source_root=root, data_dir=str(tmp_path / "a"), **STREAMS)),
        split)
    b = read_split(ml_collections.ConfigDict(
        dict(name="builtin", source_root=moved, data_dir=str(tmp_path / "b"), **STREAMS)),
        split)
    assert a == b


def test_split_fractions_are_90_5_5():
  n = 20_000
  counts = {s: 0 for s in data.SPLITS}
  for i in range(n):
    counts[builtin.split_of(f"dir{i % 13}/file_{i}.py")] += 1
  # Binomial standard deviations: 0.3% (train) and 0.15% (others); allow 5 sigma.
  assert abs(counts["train"] / n - 0.90) < 0.015
  assert abs(counts["validation"] / n - 0.05) < 0.008
  assert abs(counts["test"] / n - 0.05) < 0.008


def test_missing_source_root_is_named(tmp_path):
  cfg = ml_collections.ConfigDict(dict(name="builtin", source_root=str(tmp_path / "nope"),
                                       data_dir=str(tmp_path), **STREAMS))
  with pytest.raises(FileNotFoundError, match="nope"):
    data.load_tokens(cfg, "train")


def test_stream_segments_are_contiguous_per_stream():
  tokens = np.random.default_rng(1).integers(0, 256, size=1003).astype(np.uint8)
  b, s = 4, 10
  segments = StreamSegments(tokens, b, s)
  stream_len = len(tokens) // b
  assert len(segments) == (stream_len - 1) // s
  for t in range(len(segments)):
    batch = segments[t]
    for i in range(b):
      start = i * stream_len + t * s
      np.testing.assert_array_equal(batch["inputs"][i], tokens[start:start + s])
      np.testing.assert_array_equal(batch["targets"][i], tokens[start + 1:start + s + 1])
  assert len(list(eval_batches(tokens, b, s))) == len(segments)
  assert len(list(eval_batches(tokens, b, s, max_batches=3))) == 3


def test_process_shards_hold_their_block_of_streams():
  """Each process's shard is its block of rows of every segment; together they are the
  unsharded batch, whatever the number of shards."""
  tokens = np.random.default_rng(2).integers(0, 256, size=1003).astype(np.uint8)
  whole = eval_batches(tokens, 8, 10)
  for count in (2, 4):
    shards = [eval_batches(tokens, 8, 10, shard=grain.sharding.ShardOptions(i, count))
              for i in range(count)]
    for t, batch in enumerate(whole):
      np.testing.assert_array_equal(
          np.concatenate([shard[t]["inputs"] for shard in shards]), batch["inputs"])
  with pytest.raises(ValueError, match="3 equal shards"):
    StreamSegments(tokens, 8, 10, grain.sharding.ShardOptions(0, 3))


def test_train_iterator_state_round_trips_and_repeats():
  tokens = np.arange(200, dtype=np.uint8)
  it = train_iterator(tokens, 2, 9)
  n = len(StreamSegments(tokens, 2, 9))
  first_epoch = [next(it)["inputs"] for _ in range(n)]
  np.testing.assert_array_equal(next(it)["inputs"], first_epoch[0])  # next epoch restarts
  state = it.get_state()
  expected = [next(it)["inputs"] for _ in range(3)]
  fresh = train_iterator(tokens, 2, 9)
  fresh.set_state(state)
  for want in expected:
    np.testing.assert_array_equal(next(fresh)["inputs"], want)


def test_too_short_split_is_refused():
  with pytest.raises(ValueError, match="too short"):
    StreamSegments(np.zeros(20, np.uint8), batch_size=4, seq_len=8)
