"""The `enwik8` builder from a test-made enwik8.zip, and the paper's E8 config end to end."""

import json
import os
import zipfile

import ml_collections
import numpy as np
import pytest
import tensorflow_datasets as tfds

from sparse_jax.configs import e8_dense
from sparse_jax import data
from sparse_jax.data import enwik8, sources
from sparse_jax.data.lm_stream import StreamSegments, train_iterator
from sparse_jax.tasks import train_and_evaluate
from sparse_jax.tasks.runs import evaluate_checkpoint

# The stream fields every `data` section has (not used by these dataset-level calls).
STREAMS = dict(batch_size=2, seq_len=16)

SCALED_SPLIT = (7_000, 1_500, 1_500)  # The standard 90/5/5 shape is irrelevant here.


def wiki_like_bytes(n: int, seed: int = 0) -> bytes:
  """`n` bytes of XML-ish text with multi-byte UTF-8 characters, like the real dump."""
  rng = np.random.default_rng(seed)
  words = ["<page>", "<title>", "the", "Anarchism", "of", "[[link]]", "été", "日本", "&amp;",
           "\n", "1992", "{{cite}}"]
  text = " ".join(rng.choice(words, size=n)).encode("utf-8")
  return text[:n]


def write_zip(path, content: bytes, member: str = "enwik8") -> None:
  with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as archive:
    archive.writestr(member, content)


@pytest.fixture(scope="module")
def source(tmp_path_factory):
  """A manual_dir holding an enwik8.zip of `sum(SCALED_SPLIT)` bytes."""
  manual_dir = tmp_path_factory.mktemp("manual")
  content = wiki_like_bytes(sum(SCALED_SPLIT))
  write_zip(manual_dir / "enwik8.zip", content)
  return str(manual_dir), content


def enwik8_config(manual_dir, data_dir, split_bytes=SCALED_SPLIT, download=False):
  return ml_collections.ConfigDict(dict(name="enwik8", manual_dir=str(manual_dir),
                                        data_dir=str(data_dir), download=download,
                                        split_bytes=split_bytes, **STREAMS))


def test_default_split_is_the_standard_90m_5m_5m():
  assert enwik8.STANDARD_SPLIT_BYTES == (
      ("train", 90_000_000), ("validation", 5_000_000), ("test", 5_000_000))
  spec = data.spec(ml_collections.ConfigDict(dict(name="enwik8", **STREAMS)))
  assert (spec.vocab_size, spec.unit) == (256, "byte")


def test_splits_are_the_exact_byte_ranges_in_source_order(source, tmp_path):
  manual_dir, content = source
  builder = enwik8.Enwik8(manual_dir=manual_dir, download=False, chunk_bytes=512,
                          split_bytes=tuple(zip(data.SPLITS, SCALED_SPLIT)),
                          data_dir=str(tmp_path), file_format="array_record")
  builder.download_and_prepare()
  start = 0
  for split, n_bytes in zip(data.SPLITS, SCALED_SPLIT):
    records = builder.as_data_source(split)
    assert len(records) == -(-n_bytes // 512)  # several records, written in order
    joined = b"".join(bytes(np.asarray(records[i]["bytes"])) for i in range(len(records)))
    assert joined == content[start:start + n_bytes]
    start += n_bytes


def test_load_tokens_gives_each_split_as_bytes(source, tmp_path):
  manual_dir, content = source
  cfg = enwik8_config(manual_dir, tmp_path)
  test = data.load_tokens(cfg, "test")
  assert test.dtype == np.uint8 and test.tobytes() == content[-SCALED_SPLIT[2]:]
  assert data.load_split(cfg, "validation").words is None  # bits per byte, no words


def test_wrong_size_source_is_refused_with_its_size(source, tmp_path):
  manual_dir, _ = source
  with pytest.raises(sources.BadSourceError, match=r"holds 10,000 bytes, expected 100,000,000"):
    data.load_tokens(enwik8_config(manual_dir, tmp_path, split_bytes=None), "train")


def test_truncated_zip_is_refused(source, tmp_path):
  manual_dir, _ = source
  with open(os.path.join(manual_dir, "enwik8.zip"), "rb") as f:
    whole = f.read()
  half = whole[:len(whole) // 2]
  truncated = tmp_path / "manual"
  truncated.mkdir()
  (truncated / "enwik8.zip").write_bytes(half)
  with pytest.raises(sources.BadSourceError, match="not a complete enwik8.zip"):
    data.load_tokens(enwik8_config(truncated, tmp_path / "tfds"), "train")


def test_missing_source_names_file_manual_dir_and_url(tmp_path):
  manual_dir = tmp_path / "empty_manual"
  with pytest.raises(sources.MissingSourceError) as error:
    data.load_tokens(enwik8_config(manual_dir, tmp_path), "train")
  for expected in ("enwik8.zip", str(manual_dir), enwik8.URL):
    assert expected in str(error.value)


def test_download_is_used_when_manual_dir_lacks_the_file(source, tmp_path, monkeypatch):
  """No network in tests: the download manager is replaced by one that serves the zip."""
  manual_dir, content = source
  fetched = []

  def fake_download(self, url):
    fetched.append(url)
    return os.path.join(manual_dir, "enwik8.zip")

  monkeypatch.setattr(tfds.download.DownloadManager, "download", fake_download)
  cfg = enwik8_config(tmp_path / "no_manual", tmp_path / "tfds", download=True)
  assert data.load_tokens(cfg, "train").tobytes() == content[:SCALED_SPLIT[0]]
  assert fetched == [enwik8.URL]

  def failing_download(self, url):
    raise ConnectionError("network is unreachable")

  monkeypatch.setattr(tfds.download.DownloadManager, "download", failing_download)
  with pytest.raises(sources.MissingSourceError, match="network is unreachable") as error:
    data.load_tokens(enwik8_config(tmp_path / "no_manual", tmp_path / "other", download=True),
                     "train")
  assert enwik8.URL in str(error.value)


def test_streams_continue_across_segments_and_iterator_state_round_trips(source, tmp_path):
  manual_dir, _ = source
  tokens = data.load_tokens(enwik8_config(manual_dir, tmp_path), "train")
  batch, seq_len = 4, 32
  segments = StreamSegments(tokens, batch, seq_len)
  stream_len = len(tokens) // batch
  for t in range(len(segments) - 1):
    now, after = segments[t], segments[t + 1]
    np.testing.assert_array_equal(after["inputs"][:, 0], now["targets"][:, -1])
    for i in range(batch):  # segment t + 1 of stream i is the text right after segment t
      start = i * stream_len + (t + 1) * seq_len
      np.testing.assert_array_equal(after["inputs"][i], tokens[start:start + seq_len])

  it = train_iterator(tokens, batch, seq_len)
  for _ in range(len(segments) // 2):  # mid-epoch
    next(it)
  state = json.loads(json.dumps(it.get_state()))  # as a checkpoint stores it
  expected = [next(it) for _ in range(len(segments))]  # runs into the next epoch
  restored = train_iterator(tokens, batch, seq_len)
  restored.set_state(state)
  for want in expected:
    got = next(restored)
    np.testing.assert_array_equal(got["inputs"], want["inputs"])
    np.testing.assert_array_equal(got["targets"], want["targets"])


def test_e8_config_trains_and_evaluates_on_a_prepared_copy(source, tmp_path):
  """`train.py --config=e8_dense` with a tiny prepared copy and a tiny model."""
  manual_dir, _ = source
  config = e8_dense.get_config()
  config.data.update(manual_dir=manual_dir, data_dir=str(tmp_path / "tfds"), download=False,
                     split_bytes=SCALED_SPLIT, batch_size=4, seq_len=16)
  config.model.update(d_model=32, n_layers=2, n_heads=2, head_dim=16, mem_len=16)
  config.model.ff.d_ff = 64
  config.train.update(steps=4, log_every=2, ckpt_every=4, eval_every=100)
  config.eval.update(batch_size=2, mem_len=64, max_batches=3)
  config.mesh.update(data=1, fsdp=2)  # two-way FSDP on the simulated devices
  workdir = str(tmp_path / "run")
  final = train_and_evaluate(config, workdir)
  assert final["step"] == 4 and np.isfinite(final["bits_per_byte"])
  results, _ = evaluate_checkpoint(workdir, split="test", max_batches=2)
  assert results["tokens"] == 2 * 2 * 16 and "word_perplexity" not in results
  assert results["bits_per_byte"] == pytest.approx(results["loss"] / np.log(2))
