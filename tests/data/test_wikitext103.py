"""The `wikitext103` builder from a test-made raw archive, its SentencePiece model, per-word
perplexity, and the paper's WT-S config end to end."""

import math
import os
import shutil
import zipfile

import ml_collections
import numpy as np
import pytest

from sparse_jax.configs import wt103_s_dense
from sparse_jax import data
from sparse_jax.data import sentencepiece_tokenizer, sources, wikitext103
from sparse_jax.data.lm_stream import StreamSegments
from sparse_jax.tasks import train_and_evaluate
from sparse_jax.tasks.lm_evaluation import lm_metrics
from sparse_jax.tasks.runs import evaluate_checkpoint
from sparse_jax.validation import ConfigError

VOCAB = 330  # 256 byte pieces + specials + a few dozen pieces: trains in milliseconds.
WORDS = ["the", "game", "of", "Valkyria", "Chronicles", "is", "a", "tactical", "role", "@-@",
         "playing", "video", "3", "@,@", "000", "in", "Japan", "(", ")", ",", "."]


def raw_split(n_articles: int, seed: int) -> str:
  """Text in the layout of `wiki.*.raw`: headings, blank lines, space-led paragraphs."""
  rng = np.random.default_rng(seed)
  lines = [" \n"]
  for article in range(n_articles):
    lines += [f" = Article {article} = \n", " \n"]
    for _ in range(3):
      lines.append(" " + " ".join(rng.choice(WORDS, size=rng.integers(5, 40))) + " . \n")
    lines += [" = = Reception = = \n", " \n", " Süßes Café — 東京 ( 1992 ) . \n", " \n"]
  return "".join(lines)


@pytest.fixture(scope="module")
def texts() -> dict[str, str]:
  return {"train": raw_split(60, 0), "validation": raw_split(8, 1), "test": raw_split(8, 2)}


@pytest.fixture(scope="module")
def manual_dir(texts, tmp_path_factory) -> str:
  """A manual_dir holding the raw archive with the official directory and file names."""
  directory = tmp_path_factory.mktemp("manual")
  with zipfile.ZipFile(directory / wikitext103.ARCHIVE, "w", zipfile.ZIP_DEFLATED) as archive:
    for split, name in wikitext103.FILES.items():
      archive.writestr(f"wikitext-103-raw/{name}", texts[split])
  return str(directory)


def wt_config(data_dir, *, manual_dir=None, source_dir=None, vocab=VOCAB):
  return ml_collections.ConfigDict(dict(
      name="wikitext103", data_dir=str(data_dir), manual_dir=manual_dir, source_dir=source_dir,
      download=False, sp_vocab_size=vocab, batch_size=2, seq_len=16))


@pytest.fixture(scope="module")
def prepared(manual_dir, tmp_path_factory) -> ml_collections.ConfigDict:
  return wt_config(tmp_path_factory.mktemp("tfds"), manual_dir=manual_dir)


def test_sentencepiece_round_trips_every_split_and_counts_words(prepared, texts):
  tokenizer = data.load_tokenizer(prepared)
  assert tokenizer.vocab_size <= VOCAB
  for split, text in texts.items():
    loaded = data.load_split(prepared, split)
    assert loaded.tokens.dtype == np.uint16 and loaded.tokens.max() < tokenizer.vocab_size
    assert len(loaded.tokens) < len(text)  # subwords, not characters or bytes
    assert tokenizer.decode(loaded.tokens) == text
    assert loaded.words == len(text.split())
  unseen = " naïve ☃ text\n"  # characters absent from train fall back to bytes, exactly
  assert tokenizer.decode(tokenizer.encode_lines([unseen])) == unseen


def test_model_is_stored_with_the_data_and_reused(prepared):
  builder = data.prepared_builder(prepared)
  model_path = sentencepiece_tokenizer.model_path(os.fspath(builder.data_dir))
  modified = os.path.getmtime(model_path)
  tokens = data.load_tokens(prepared, "validation")
  np.testing.assert_array_equal(data.load_tokens(prepared, "validation"), tokens)
  assert os.path.getmtime(model_path) == modified  # not retrained
  assert os.path.basename(os.path.dirname(os.fspath(builder.data_dir))) == f"sp{VOCAB}"


def test_extracted_directory_gives_the_same_tokens(prepared, manual_dir, tmp_path):
  with zipfile.ZipFile(os.path.join(manual_dir, wikitext103.ARCHIVE)) as archive:
    archive.extractall(tmp_path / "extracted")
  cfg = wt_config(tmp_path / "tfds", source_dir=str(tmp_path / "extracted/wikitext-103-raw"))
  for split in data.SPLITS:
    np.testing.assert_array_equal(data.load_tokens(cfg, split),
                                  data.load_tokens(prepared, split))


def test_missing_or_incomplete_sources_say_what_is_expected(manual_dir, tmp_path):
  empty = str(tmp_path / "empty")
  with pytest.raises(sources.MissingSourceError) as error:
    data.load_tokens(wt_config(tmp_path / "a", manual_dir=empty), "train")
  for expected in (wikitext103.ARCHIVE, empty, wikitext103.URL):
    assert expected in str(error.value)

  partial = tmp_path / "partial"
  shutil.copytree(manual_dir, partial)
  with zipfile.ZipFile(partial / wikitext103.ARCHIVE, "w") as archive:
    archive.writestr("wikitext-103-raw/wiki.train.raw", " = A = \n")
  with pytest.raises(sources.BadSourceError, match="wiki.valid.raw"):
    data.load_tokens(wt_config(tmp_path / "b", manual_dir=str(partial)), "train")
  with pytest.raises(sources.MissingSourceError, match="wiki.test.raw"):
    data.load_tokens(wt_config(tmp_path / "c", source_dir=str(tmp_path)), "train")


def test_sentencepiece_vocab_size_is_validated():
  with pytest.raises(ConfigError, match=r"data\.sp_vocab_size"):
    data.spec(wt_config("unused", vocab=64))


def test_word_and_token_perplexity_share_one_log_likelihood():
  nll_sum, n_tokens, n_words = 7321.5, 2000, 1250
  metrics = lm_metrics(nll_sum, n_tokens, "token", words_per_token=n_words / n_tokens)
  assert math.log(metrics["perplexity"]) * n_tokens == pytest.approx(nll_sum)
  assert math.log(metrics["word_perplexity"]) * n_words == pytest.approx(nll_sum)
  assert "word_perplexity" not in lm_metrics(nll_sum, n_tokens, "token")


def test_wt_s_config_trains_and_reports_token_and_word_perplexity(manual_dir, tmp_path):
  """`train.py --config=wt103_s_dense` with a tiny prepared copy and tiny model."""
  config = wt103_s_dense.get_config()
  config.data.update(manual_dir=manual_dir, data_dir=str(tmp_path / "tfds"), download=False,
                     sp_vocab_size=VOCAB, batch_size=4, seq_len=16)
  config.model.update(vocab_size=VOCAB, d_model=32, n_layers=2, n_heads=2, head_dim=16,
                      mem_len=16)
  config.model.ff.d_ff = 64
  config.train.update(steps=4, log_every=2, ckpt_every=4, eval_every=100)
  config.eval.update(batch_size=2, mem_len=64, max_batches=None)
  config.mesh.data = 2  # two-way data parallel on the simulated devices
  workdir = str(tmp_path / "run")
  final = train_and_evaluate(config, workdir)
  assert final["step"] == 4 and np.isfinite(final["perplexity"])

  results, _ = evaluate_checkpoint(workdir, split="test")  # the whole split
  test = data.load_split(config.data, "test")
  assert results["tokens"] == len(StreamSegments(test.tokens, 2, 16)) * 2 * 16
  nll_sum = results["loss"] * results["tokens"]
  assert math.log(results["perplexity"]) == pytest.approx(results["loss"])
  assert math.log(results["word_perplexity"]) == pytest.approx(
      nll_sum / (results["tokens"] * test.words / len(test.tokens)))
  assert results["word_perplexity"] > results["perplexity"]  # a word spans several tokens
