"""Bad data gets one clear error before training starts: empty text files, a split shorter than
one training (or evaluation) segment, binary files, text that is not UTF-8 for SentencePiece,
`model.vocab_size` below the tokenizer's, a GLUE file with a missing label, a `builtin` source
root without files for a split. Each case runs `train_and_evaluate` on files the test writes and
checks the error's type and what it names, and that no step ran (no metrics, no checkpoint)."""

import gzip
import os
import shutil
from unittest import mock

import ml_collections
import pytest
import tensorflow_datasets as tfds
from lm_testing import tiny_lm_config

import glue_testing
from sparse_jax.configs import glue
from sparse_jax.data import classification
from sparse_jax.data.sources import BadSourceError
from sparse_jax.tasks import train_and_evaluate
from sparse_jax.validation import ConfigError

TEXT = "".join(f"line {i}: the quick brown fox jumps over the lazy dog.\n" for i in range(400))


def _write(path, content) -> str:
  mode = "wb" if isinstance(content, bytes) else "w"
  with open(path, mode, **({} if mode == "wb" else {"encoding": "utf-8"})) as f:
    f.write(content)
  return str(path)


def _text_files_config(tmp_path, stdlib_slice, train=TEXT, validation=TEXT[:2000],
                       test=TEXT[:2000], **fields):
  config = tiny_lm_config(stdlib_slice, str(tmp_path / "tfds"))
  files = {split: _write(tmp_path / f"{split}.txt", content) for split, content in
           (("train", train), ("validation", validation), ("test", test))}
  config.data = ml_collections.ConfigDict(dict(
      name="text_files", data_dir=str(tmp_path / "tfds"), batch_size=4, seq_len=16,
      train_file=files["train"], validation_file=files["validation"], test_file=files["test"],
      **fields))
  if fields.get("tokenizer") == "sentencepiece":
    config.model.vocab_size = fields["sp_vocab_size"]
  return config, files


def _fails_before_training(config, tmp_path, error, *fragments):
  workdir = tmp_path / "run"
  with pytest.raises(error) as raised:
    train_and_evaluate(config, str(workdir))
  message = str(raised.value)
  for fragment in fragments:
    assert fragment in message, message
  assert not os.path.exists(workdir / "metrics.jsonl")
  assert not os.path.exists(workdir / "checkpoints") or not os.listdir(workdir / "checkpoints")
  return message


SENTENCEPIECE = {"tokenizer": "sentencepiece", "sp_vocab_size": 330}


@pytest.mark.parametrize("tokenizer", [{"tokenizer": "bytes"}, SENTENCEPIECE],
                         ids=["bytes", "sentencepiece"])
@pytest.mark.parametrize("split", ["train", "validation"])
def test_an_empty_text_file(split, tokenizer, tmp_path, stdlib_slice):
  config, files = _text_files_config(tmp_path, stdlib_slice, **{split: ""}, **tokenizer)
  _fails_before_training(config, tmp_path, BadSourceError, files[split], "empty")


def test_a_whole_file_whose_validation_part_is_empty(tmp_path, stdlib_slice):
  """`file` cut by fractions where the text has too few lines for a validation part."""
  config, _ = _text_files_config(tmp_path, stdlib_slice)
  whole = _write(tmp_path / "whole.txt", "one single long line without a break " * 200)
  for field in ("train_file", "validation_file", "test_file"):
    del config.data[field]
  config.data.update(file=whole, split_fractions=(0.9, 0.05, 0.05))
  _fails_before_training(config, tmp_path, BadSourceError, whole, "validation", "empty")


@pytest.mark.parametrize("split, batch_field", [("train", "data.batch_size"),
                                                ("validation", "eval.batch_size")])
def test_a_split_shorter_than_one_segment(split, batch_field, tmp_path, stdlib_slice):
  config, files = _text_files_config(tmp_path, stdlib_slice, **{split: "short text\n"})
  _fails_before_training(config, tmp_path, BadSourceError, f"{split} split", "11 tokens",
                         batch_field, "data.seq_len")


@pytest.mark.parametrize("content, kind", [
    (gzip.compress(TEXT.encode()), "gzip"),
    (b"PK\x03\x04" + os.urandom(2000), "zip"),
    (TEXT[:1000].encode() + b"\x00\x01\x02" + TEXT[:1000].encode(), "NUL byte at offset 1000"),
], ids=["gzip", "zip", "nul"])
@pytest.mark.parametrize("tokenizer", [{"tokenizer": "bytes"}, SENTENCEPIECE],
                         ids=["bytes", "sentencepiece"])
def test_a_binary_file(content, kind, tokenizer, tmp_path, stdlib_slice):
  config, files = _text_files_config(tmp_path, stdlib_slice, train=content, **tokenizer)
  _fails_before_training(config, tmp_path, BadSourceError, files["train"], kind)


def test_invalid_utf8_for_sentencepiece(tmp_path, stdlib_slice):
  latin1 = ("Der Bär läuft über die Straße.\n" * 200).encode("latin-1")
  config, files = _text_files_config(tmp_path, stdlib_slice, validation=latin1,
                                     **SENTENCEPIECE)
  _fails_before_training(config, tmp_path, BadSourceError, files["validation"], "UTF-8",
                         "byte 5", "tokenizer='bytes'")


def test_vocab_size_below_the_tokenizers(tmp_path, stdlib_slice):
  config, _ = _text_files_config(tmp_path, stdlib_slice, **SENTENCEPIECE)
  config.model.vocab_size = 256
  _fails_before_training(config, tmp_path, ConfigError, "model.vocab_size", "330")


def test_builtin_root_without_files_for_a_split(tmp_path, stdlib_slice):
  """A `builtin` source root whose files all hash into train: no validation or test files."""
  from sparse_jax.data import builtin
  root = tmp_path / "root"
  for path in builtin.list_sources(stdlib_slice):
    if builtin.split_of(path) == "train":
      os.makedirs(os.path.dirname(root / path), exist_ok=True)
      shutil.copy(os.path.join(stdlib_slice, path), root / path)
  config = tiny_lm_config(str(root), str(tmp_path / "tfds"))
  _fails_before_training(config, tmp_path, BadSourceError, str(root), "validation")


# --- A GLUE task file with a missing label.

@pytest.mark.parametrize("row", ["3\tA row.\tWithout a label.\n", "3\tA row.\tEmpty label.\t\n"],
                         ids=["no-column", "empty"])
def test_a_glue_file_with_a_missing_label(row, tmp_path):
  """Through `load_task_split`, what the fine-tuning task's `load_data` calls (after building
  the model from its backbone, before any step)."""
  folder, files = glue_testing.GLUE_ARCHIVES["https://dl.fbaipublicfiles.com/glue/data/RTE.zip"]
  extracted = tmp_path / "rte"
  os.makedirs(extracted / folder)
  for name, text in files.items():
    _write(extracted / folder / name, text + row if name == "train.tsv" else text)
  config = glue.get_config("rte,spartan")
  config.task.update(data_dir=str(tmp_path / "tfds"), max_len=24)
  with (mock.patch.object(tfds.download.DownloadManager, "download_and_extract",
                          autospec=True, side_effect=lambda self, url: str(extracted)),
        pytest.raises(BadSourceError) as raised):
    classification.load_task_split(config.task, "train")
  message = str(raised.value)
  for fragment in ("glue/rte", "train file", "train.tsv", "1 row(s)", "data row 4", "A row."):
    assert fragment in message, message
