"""arXiv summarisation data: TFDS's `scientific_papers/arxiv` builder prepared without
TensorFlow from a test-made archive in the official format, the SentencePiece ids, the ROUGE
references and the config."""

import os
import sys

import numpy as np
import pytest
import tensorflow_datasets as tfds
from tensorflow_datasets.datasets.scientific_papers import scientific_papers_dataset_builder

from sparse_jax.data import arxiv, rouge_metrics, seq2seq, sources
from sparse_jax.validation import ConfigError
from tests.arxiv_testing import (PAPERS, VOCAB, config, prepare, random_papers,
                                  write_archive)

@pytest.fixture(scope="module")
def papers() -> dict[str, list[dict]]:
  return random_papers()


def expected_examples(papers: list[dict]) -> dict[str, str]:
  """Article text -> reference abstract, written out from the JSON independently of the code:
  paragraphs joined by newlines; abstract sentences untagged, one per line."""
  return {"\n".join(p["article_text"]):
          "\n".join(s.removeprefix("<S> ").removesuffix(" </S>") for s in p["abstract_text"])
          for p in papers}


@pytest.fixture(scope="module")
def manual_dir(papers, tmp_path_factory) -> str:
  return write_archive(papers, tmp_path_factory.mktemp("manual"))


@pytest.fixture(scope="module")
def data_dir(manual_dir, tmp_path_factory):
  directory = tmp_path_factory.mktemp("tfds")
  prepare(directory, manual_dir)
  return directory


def read_all(dataset) -> list:
  return [dataset[i] for i in range(len(dataset))]


def test_url_and_archive_are_tfds_registered_ones():
  registered = scientific_papers_dataset_builder.Builder.url_infos[arxiv.URL]
  assert registered.filename == "arxiv-dataset.zip" == arxiv.ARCHIVE
  assert arxiv.ScientificPapers.url_infos[arxiv.URL] == registered


def test_prepares_and_reads_without_tensorflow(data_dir, manual_dir, papers):
  assert "tensorflow" not in sys.modules
  records_dir = os.path.join(data_dir, "scientific_papers", "arxiv", "1.1.1")
  assert any(name.endswith("array_record-00000-of-00001") for name in os.listdir(records_dir))
  for split, split_papers in papers.items():
    loaded = arxiv.load_split(config(data_dir, manual_dir), split)
    assert sorted(read_all(loaded.references)) == sorted(
        expected_examples(split_papers).values())


@pytest.mark.parametrize("article_end, article_end_id", [("pad", 0), ("eos", 1)])
def test_examples_are_article_and_abstract_ids_with_their_end(data_dir, manual_dir, papers,
                                                              article_end, article_end_id):
  """Trax's gin appends PAD (0) to articles and EOS (1) to abstracts; `eos` ends both."""
  loaded = arxiv.load_split(config(data_dir, manual_dir, article_end=article_end), "test")
  expected = expected_examples(papers["test"])
  examples, references = read_all(loaded.examples), read_all(loaded.references)
  assert len(examples) == PAPERS["test"]
  for example, reference in zip(examples, references):
    assert example["inputs"][-1] == article_end_id and example["targets"][-1] == 1
    for ids in example.values():
      assert ids.dtype == np.int32
      assert not np.isin(ids[:-1], [0, 1]).any()  # PAD and EOS are never text.
    article = loaded.tokenizer.decode(example["inputs"][:-1])
    assert expected[article] == reference
    assert loaded.tokenizer.decode(example["targets"][:-1]) == reference


def test_long_texts_are_cut_to_the_max_lengths_before_eos(data_dir, manual_dir):
  full = read_all(arxiv.load_split(config(data_dir, manual_dir), "validation").examples)
  short_cfg = config(data_dir, manual_dir, max_input_len=7, max_target_len=3)
  short = read_all(arxiv.load_split(short_cfg, "validation").examples)
  assert arxiv.max_lengths(short_cfg) == (8, 4)
  for f, s in zip(full, short):
    assert len(f["inputs"]) > 8 and len(f["targets"]) > 4
    np.testing.assert_array_equal(s["inputs"], np.append(f["inputs"][:7], 0))
    np.testing.assert_array_equal(s["targets"], np.append(f["targets"][:3], 1))


def test_max_examples_keeps_the_first_records(data_dir, manual_dir):
  full = arxiv.load_split(config(data_dir, manual_dir), "train")
  first = arxiv.load_split(config(data_dir, manual_dir, max_examples=2), "train")
  assert len(first.examples) == len(first.references) == 2
  assert read_all(first.references) == read_all(full.references)[:2]


def test_tokenizer_is_stored_beside_the_records_and_reused(data_dir, manual_dir):
  path = os.path.join(data_dir, "scientific_papers", "arxiv", "1.1.1", f"sp{VOCAB}",
                      "sentencepiece.model")
  modified = os.path.getmtime(path)
  tokenizer = arxiv.load_tokenizer(config(data_dir, manual_dir))
  assert os.path.getmtime(path) == modified
  assert tokenizer.vocab_size <= VOCAB
  unseen = "Ω-bounds for 東京 🙂\nnew line"
  ids = arxiv.encode(tokenizer, unseen, 10_000)
  assert not np.isin(ids[:-1], [0, 1]).any() and ids[-1] == 1
  assert tokenizer.decode(ids[:-1]) == unseen


def test_decode_answer_stops_at_eos_or_pad(data_dir, manual_dir):
  tokenizer = arxiv.load_tokenizer(config(data_dir, manual_dir))
  ids = arxiv.encode(tokenizer, "we study the spin .", 100)
  assert arxiv.decode_answer(tokenizer, np.append(ids, [7, 9])) == "we study the spin ."
  assert arxiv.decode_answer(tokenizer, np.append(ids[:-1], [0, 0])) == "we study the spin ."
  assert arxiv.decode_answer(tokenizer, ids[:-1]) == "we study the spin ."
  beyond = np.insert(ids, 2, tokenizer.vocab_size)  # An id the tokenizer lacks: dropped.
  assert arxiv.decode_answer(tokenizer, beyond) == "we study the spin ."


def test_tfds_own_builder_reads_the_prepared_records(data_dir, manual_dir, papers):
  builder = tfds.builder("scientific_papers/arxiv:1.1.1", data_dir=str(data_dir))
  source = builder.as_data_source("test")
  articles = {record["article"].decode("utf-8") for record in read_all(source)}
  assert articles == set(expected_examples(papers["test"]))


def test_missing_archive_without_download_names_file_dir_and_url(tmp_path):
  manual = tmp_path / "manual"
  manual.mkdir()
  with pytest.raises(sources.MissingSourceError) as error:
    arxiv.load_split(config(tmp_path / "tfds", str(manual)), "test")
  message = str(error.value)
  assert "arxiv-dataset.zip" in message and str(manual) in message
  assert arxiv.URL in message and "data.download=False" in message


def test_archive_with_another_checksum_is_refused(manual_dir, tmp_path):
  with pytest.raises(sources.BadSourceError, match="not the official archive"):
    arxiv.load_split(config(tmp_path, manual_dir), "test")


def test_defaults_are_the_papers():
  cfg = arxiv.ArxivConfig.parse({}, "data")
  assert (cfg.vocab_size, cfg.max_input_len, cfg.max_target_len) == (32_000, 15_359, 1_023)
  assert cfg.download and cfg.max_examples is None and cfg.article_end == "pad"
  assert cfg.resolved_manual_dir() == os.path.join(tfds.core.constants.DATA_DIR, "downloads",
                                                   "manual")


@pytest.mark.parametrize("fields, field", [
    ({"vocab_size": 100}, "data.vocab_size"),
    ({"max_input_len": 0}, "data.max_input_len"),
    ({"max_target_len": -1}, "data.max_target_len"),
    ({"max_examples": 0}, "data.max_examples"),
    ({"download": "yes"}, "data.download"),
    ({"article_end": "eol"}, "data.article_end"),
    ({"vocab": 8000}, "data.vocab"),
])
def test_config_errors_name_the_field(fields, field):
  with pytest.raises(ConfigError, match=f"'{field}'"):
    arxiv.ArxivConfig.parse(fields, "data")


def test_unknown_split_is_refused(data_dir, manual_dir):
  with pytest.raises(ConfigError, match="'split'"):
    arxiv.load_split(config(data_dir, manual_dir), "dev")


def test_seq2seq_data_pads_batches_resumes_and_scores_by_rouge(data_dir, manual_dir):
  """The `data.name = "arxiv"` variant the Terraformer task reads: padded shapes, a training
  iterator that resumes from its state, and ROUGE of answers against the abstracts (the
  targets themselves score 100, empty answers 0)."""
  data = seq2seq.Seq2SeqDataConfig.parse(
      dict(name="arxiv", batch_size=4, data_dir=str(data_dir), manual_dir=manual_dir,
           download=False, vocab_size=VOCAB, max_input_len=64), "data").load()
  n_inputs, n_targets = data.max_lengths("test")
  assert (n_inputs, n_targets) == (65, arxiv.PAPER_MAX_TARGET_LEN + 1)
  arrays = data.eval_arrays("test", 3)
  assert arrays["inputs"].shape == (3, n_inputs) and arrays["targets"].shape == (3, n_targets)
  assert data.score(arrays["targets"], "test", 3) == pytest.approx(
      dict.fromkeys(rouge_metrics.ROUGE_TYPES, 100.0))
  assert data.score(np.ones_like(arrays["targets"]), "test", 3) == dict.fromkeys(
      rouge_metrics.ROUGE_TYPES, 0.0)

  iterator = data.train_iterator(4, slice(None))
  next(iterator)
  state = iterator.get_state()
  expected = next(iterator)
  resumed = data.train_iterator(4, slice(None))
  resumed.set_state(state)
  batch = next(resumed)
  assert batch["inputs"].shape == (4, n_inputs)
  np.testing.assert_array_equal(batch["targets"], expected["targets"])
