"""The `text_files` builder: the user's own files, byte-level or SentencePiece."""

import ml_collections
import numpy as np
import pytest

from sparse_jax import data
from sparse_jax.data import sources, text_files
from sparse_jax.validation import ConfigError

# The stream fields every `data` section has (not used by these dataset-level calls).
STREAMS = dict(batch_size=2, seq_len=16)

VOCAB = 330


def user_text(n_lines: int, seed: int) -> str:
  rng = np.random.default_rng(seed)
  words = ["def", "return", "the", "value", "of", "x", "=", "1.5", "naïve", "→", "# note"]
  return "".join(" ".join(rng.choice(words, size=rng.integers(1, 12))) + "\n"
                 for _ in range(n_lines))


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, str]:
  """Three split files and one whole file, UTF-8 text with some blank lines."""
  root = tmp_path_factory.mktemp("user_text")
  paths = {}
  for seed, name in enumerate(("train", "validation", "test", "whole")):
    text = user_text(400 if name in ("train", "whole") else 60, seed) + "\n"
    (root / f"{name}.txt").write_text(text, encoding="utf-8")
    paths[name] = str(root / f"{name}.txt")
  return paths


def split_files_config(files, data_dir, **fields):
  return ml_collections.ConfigDict(dict(
      name="text_files", data_dir=str(data_dir), train_file=files["train"],
      validation_file=files["validation"], test_file=files["test"], **STREAMS, **fields))


def read_bytes(path) -> bytes:
  with open(path, "rb") as f:
    return f.read()


def test_byte_mode_gives_each_file_exactly(files, tmp_path):
  cfg = split_files_config(files, tmp_path, tokenizer="bytes")
  assert (data.spec(cfg).vocab_size, data.spec(cfg).unit) == (256, "byte")
  for split in data.SPLITS:
    assert data.load_tokens(cfg, split).tobytes() == read_bytes(files[split])


def test_one_file_is_cut_by_fractions_at_line_breaks(files, tmp_path):
  whole = read_bytes(files["whole"])
  cfg = ml_collections.ConfigDict(dict(name="text_files", data_dir=str(tmp_path),
                                       file=files["whole"], split_fractions=(0.8, 0.1, 0.1),
                                       **STREAMS))
  parts = [data.load_tokens(cfg, split).tobytes() for split in data.SPLITS]
  assert b"".join(parts) == whole
  for part, fraction in zip(parts, (0.8, 0.1, 0.1)):
    assert part.endswith(b"\n")
    assert abs(len(part) / len(whole) - fraction) < 0.02  # within a line or two


def test_cut_at_line_breaks_moves_each_cut_to_the_next_line():
  assert text_files.cut_at_line_breaks(b"aaaa\nbb\ncc\n", (0.5, 0.25, 0.25)) == [
      b"aaaa\nbb\n", b"cc\n", b""]
  assert text_files.cut_at_line_breaks(b"no newline", (0.5, 0.25, 0.25)) == [
      b"no newline", b"", b""]


def test_sentencepiece_mode_round_trips_text_and_counts_words(files, tmp_path):
  cfg = split_files_config(files, tmp_path, tokenizer="sentencepiece", sp_vocab_size=VOCAB)
  assert (data.spec(cfg).vocab_size, data.spec(cfg).unit) == (VOCAB, "token")
  tokenizer = data.load_tokenizer(cfg)
  for split in data.SPLITS:
    text = read_bytes(files[split]).decode("utf-8")
    loaded = data.load_split(cfg, split)
    assert tokenizer.decode(loaded.tokens) == text
    assert loaded.words == len(text.split())


def test_editing_a_file_prepares_anew(tmp_path, files):
  train = tmp_path / "train.txt"
  train.write_text("first version\n" * 50)
  cfg = split_files_config({**files, "train": str(train)}, tmp_path / "tfds")
  assert data.load_tokens(cfg, "train").tobytes() == b"first version\n" * 50
  train.write_text("second\n" * 70)
  assert data.load_tokens(cfg, "train").tobytes() == b"second\n" * 70


def test_missing_file_is_named_with_its_field(files, tmp_path):
  cfg = split_files_config({**files, "validation": str(tmp_path / "nope.txt")}, tmp_path)
  with pytest.raises(sources.MissingSourceError, match=r"nope\.txt.*data\.validation_file"):
    data.load_tokens(cfg, "train")


@pytest.mark.parametrize("fields,named", [
    (dict(train_file="a.txt"), "data.train_file"),
    (dict(file="a.txt", split_fractions=(0.9, 0.2, 0.1)), "data.split_fractions"),
    (dict(file="a.txt", split_fractions=(0.9, 0.1)), "data.split_fractions"),
    (dict(file="a.txt", split_fractions=(0.8, 0.1, 0.1), train_file="b.txt"), "data.file"),
    (dict(file="a.txt", split_fractions=(0.8, 0.1, 0.1), tokenizer="chars"), "data.tokenizer"),
    (dict(file="a.txt", split_fractions=(0.8, 0.1, 0.1), tokenizer="sentencepiece",
          sp_vocab_size=100), "data.sp_vocab_size"),
])
def test_bad_text_files_configs_name_the_field(fields, named):
  with pytest.raises(ConfigError, match=named.replace(".", r"\.")):
    data.spec(ml_collections.ConfigDict(dict(name="text_files", **STREAMS, **fields)))
