"""Our TFDS builders follow TFDS's manual_dir convention: a source placed in the directory of
`tfds.download.DownloadConfig(manual_dir=...)` or of `tfds build --manual_dir` (by default
`<data_dir>/downloads/manual`) is found, the builder's own `manual_dir` (config field
`data.manual_dir`) taking precedence when it is set; a missing source is reported with the
directory actually searched. Sources are tiny files in the real formats; nothing is downloaded.

`builtin`, `stdlib_packages` and `text_files` have no source to download (this Python's
library, the user's files), so no manual_dir either."""

import dataclasses
import os
import subprocess
import sys
import textwrap
import zipfile
from typing import Callable

import ml_collections
import numpy as np
import pytest
import tensorflow_datasets as tfds
from tensorflow_datasets.core.download import checksums
from test_enwik8 import SCALED_SPLIT, wiki_like_bytes, write_zip
from test_wikitext103 import VOCAB as WT_VOCAB, raw_split

from sparse_jax import data
from sparse_jax.data import arxiv, enwik8, sentencepiece_tokenizer, sources, wikitext103
from tests import arxiv_testing

SPLITS = ("train", "validation", "test")


def _text(value) -> str:
  return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def _records(builder, split) -> list[dict]:
  source = builder.as_data_source(split=split)
  return [source[i] for i in range(len(source))]


# --- enwik8: a zip whose `enwik8` member holds sum(SCALED_SPLIT) bytes.

def _write_enwik8(directory, seed: int) -> dict[str, bytes]:
  content = wiki_like_bytes(sum(SCALED_SPLIT), seed=seed)
  write_zip(os.path.join(directory, enwik8.ARCHIVE), content)
  ends = np.cumsum((0,) + SCALED_SPLIT)
  return {split: content[ends[i]:ends[i + 1]] for i, split in enumerate(SPLITS)}


def _make_enwik8(**kwargs):
  return enwik8.Enwik8(split_bytes=tuple(zip(SPLITS, SCALED_SPLIT)), download=False, **kwargs)


def _read_bytes(builder, split) -> bytes:
  return b"".join(bytes(np.asarray(r["bytes"], np.uint8)) for r in _records(builder, split))


def _read_enwik8(builder) -> dict[str, bytes]:
  return {split: _read_bytes(builder, split) for split in SPLITS}


# --- wikitext103: the raw archive, `wikitext-103-raw/wiki.{train,valid,test}.raw`.

def _wikitext_texts(seed: int) -> dict[str, str]:
  return {"train": raw_split(60, seed), "validation": raw_split(4, seed + 1),
          "test": raw_split(4, seed + 2)}


def _write_wikitext103(directory, seed: int) -> dict[str, str]:
  texts = _wikitext_texts(seed)
  with zipfile.ZipFile(os.path.join(directory, wikitext103.ARCHIVE), "w",
                       zipfile.ZIP_DEFLATED) as archive:
    for split, name in wikitext103.FILES.items():
      archive.writestr(f"{wikitext103.ARCHIVE_DIR}/{name}", texts[split])
  return texts


def _make_wikitext103(**kwargs):
  return wikitext103.Wikitext103(vocab_size=WT_VOCAB, download=False, **kwargs)


def _read_wikitext103(builder) -> dict[str, str]:
  tokenizer = sentencepiece_tokenizer.Tokenizer(
      sentencepiece_tokenizer.model_path(os.fspath(builder.data_dir)))
  return {split: tokenizer.decode(np.concatenate([r["tokens"] for r in _records(builder, split)]))
          for split in SPLITS}


# --- arxiv: `arxiv-dataset.zip` (tests/arxiv_testing.py), TFDS's records of its papers.

def _write_arxiv(directory, seed: int) -> dict[str, list[tuple[str, str]]]:
  papers = arxiv_testing.random_papers(seed)
  arxiv_testing.write_archive(papers, directory)
  return {split: sorted(("\n".join(p["article_text"]),
                         "\n".join(s.removeprefix("<S> ").removesuffix(" </S>")
                                   for s in p["abstract_text"])) for p in papers[split])
          for split in SPLITS}


def _make_arxiv(**kwargs):
  return arxiv.ScientificPapers(download=False, **kwargs)


def _read_arxiv(builder) -> dict[str, list[tuple[str, str]]]:
  return {split: sorted((_text(r["article"]), arxiv.reference_text(_text(r["abstract"])))
                        for r in _records(builder, split))
          for split in SPLITS}


def _register_checksum(monkeypatch, url: str, path) -> None:
  """TFDS checks an archive against the sha256 it registers for its URL: register the test
  archive's (as tests/arxiv_testing.py does)."""
  monkeypatch.setitem(arxiv.ScientificPapers.url_infos, url, checksums.compute_url_info(path))


@dataclasses.dataclass(frozen=True)
class Case:
  name: str
  filename: str
  url: str
  write: Callable  # (manual_dir, seed) -> the expected contents, by split.
  make: Callable  # (**builder kwargs) -> builder, downloading off.
  read: Callable  # builder -> its contents, by split.
  checked: bool = False  # Whether the archive's sha256 must be registered.

  def __str__(self):
    return self.name

  def put(self, directory, seed: int, monkeypatch):
    os.makedirs(directory, exist_ok=True)
    expected = self.write(directory, seed)
    if self.checked:
      _register_checksum(monkeypatch, self.url, os.path.join(directory, self.filename))
    return expected


CASES = [Case("enwik8", enwik8.ARCHIVE, enwik8.URL, _write_enwik8, _make_enwik8, _read_enwik8),
         Case("wikitext103", wikitext103.ARCHIVE, wikitext103.URL, _write_wikitext103,
              _make_wikitext103, _read_wikitext103),
         Case("arxiv", arxiv.ARCHIVE, arxiv.URL, _write_arxiv, _make_arxiv, _read_arxiv,
              checked=True)]


def _prepare(builder, manual_dir=None) -> None:
  builder.download_and_prepare(download_config=tfds.download.DownloadConfig(
      manual_dir=None if manual_dir is None else str(manual_dir), try_download_gcs=False))


@pytest.mark.parametrize("case", CASES, ids=str)
def test_download_config_manual_dir_alone(case, tmp_path, monkeypatch):
  expected = case.put(tmp_path / "manual", 0, monkeypatch)
  builder = case.make(data_dir=str(tmp_path / "tfds"))
  _prepare(builder, tmp_path / "manual")
  assert case.read(builder) == expected


@pytest.mark.parametrize("case", CASES, ids=str)
def test_tfds_default_manual_dir(case, tmp_path, monkeypatch):
  """No manual_dir anywhere: TFDS's default, `<data_dir>/downloads/manual`."""
  expected = case.put(tmp_path / "tfds" / "downloads" / "manual", 0, monkeypatch)
  builder = case.make(data_dir=str(tmp_path / "tfds"))
  _prepare(builder)
  assert case.read(builder) == expected


@pytest.mark.parametrize("case", CASES, ids=str)
def test_the_builders_manual_dir_beats_download_config(case, tmp_path, monkeypatch):
  case.put(tmp_path / "theirs", 2, monkeypatch)
  expected = case.put(tmp_path / "ours", 1, monkeypatch)  # arxiv: registers this one's sha256.
  builder = case.make(manual_dir=str(tmp_path / "ours"), data_dir=str(tmp_path / "tfds"))
  _prepare(builder, tmp_path / "theirs")
  assert case.read(builder) == expected


def test_config_field_manual_dir_beats_download_config(tmp_path, monkeypatch):
  """The training pipeline's builder (`data.spec(cfg).make_builder()`) with data.manual_dir."""
  ours, theirs = tmp_path / "ours", tmp_path / "theirs"
  os.makedirs(ours), os.makedirs(theirs)
  expected = _write_enwik8(ours, seed=1)
  _write_enwik8(theirs, seed=2)
  cfg = ml_collections.ConfigDict(dict(
      name="enwik8", manual_dir=str(ours), data_dir=str(tmp_path / "tfds"), download=False,
      split_bytes=SCALED_SPLIT, batch_size=2, seq_len=16))
  builder = data.spec(cfg).make_builder()
  _prepare(builder, theirs)
  assert _read_enwik8(builder) == expected


@pytest.mark.parametrize("where", ["download_config", "tfds_default", "builder"])
@pytest.mark.parametrize("case", CASES, ids=str)
def test_a_missing_source_names_the_directory_searched(case, where, tmp_path):
  """The error names the file, the manual_dir searched (the builder's, else DownloadConfig's,
  else `<data_dir>/downloads/manual`), the URL and both ways to set the directory."""
  data_dir = tmp_path / "tfds"
  other = tmp_path / "download_config_manual"
  os.makedirs(other)
  (other / "unrelated.txt").write_text("not the source")  # Exists, not empty, lacks the file.
  if where == "download_config":
    builder, searched = case.make(data_dir=str(data_dir)), other
  elif where == "tfds_default":
    builder, searched = case.make(data_dir=str(data_dir)), data_dir / "downloads" / "manual"
    other = None
  else:
    searched = tmp_path / "builder_manual"  # Does not exist.
    builder = case.make(manual_dir=str(searched), data_dir=str(data_dir))
  with pytest.raises(sources.MissingSourceError) as error:
    _prepare(builder, other)
  message = str(error.value)
  assert f"not found in manual_dir {str(searched)!r}" in message
  for part in (case.filename, case.url, "data.manual_dir", "DownloadConfig(manual_dir=...)",
               "tfds build --manual_dir", "downloading is off"):
    assert part in message


# `tfds` (TFDS's CLI entry point, tensorflow_datasets/scripts/cli/main.py, the `tfds`
# console script) run as installed. Its main.py imports every subcommand's module, and two
# of them cannot be imported without TensorFlow or mlcroissant, which this project does not
# need: convert_format (its convert_format_utils evaluates `tf.train.Example` at import) and
# croissant (imports mlcroissant). Where they fail to import they are replaced by empty
# commands; `build` and the rest of the CLI are TFDS's own. Any download raises at once (the
# sources are in the manual_dir; a builder that missed it fails instead of reaching for the
# network). TEST_CHECKSUM_URL/FILE register a test archive's sha256 for a URL (TFDS checks
# arxiv's).
TFDS_CLI = textwrap.dedent("""
    import dataclasses, importlib, os, sys, types
    from tensorflow_datasets.core.download import checksums, download_manager
    def no_download(self, resource):
      raise RuntimeError(f"test: no network, not downloading {resource.url}")
    download_manager.DownloadManager._download = no_download
    if os.environ.get("TEST_CHECKSUM_URL"):
      load_url_infos = checksums.load_url_infos
      def load_with_test_archive(path):
        infos = dict(load_url_infos(path) or {})
        infos[os.environ["TEST_CHECKSUM_URL"]] = checksums.compute_url_info(
            os.environ["TEST_CHECKSUM_FILE"])
        return infos
      checksums.load_url_infos = load_with_test_archive
    for name, command in (("convert_format", "Args"), ("croissant", "CmdArgs")):
      module_name = f"tensorflow_datasets.scripts.cli.{name}"
      try:
        importlib.import_module(module_name)
      except ImportError:
        module = types.ModuleType(module_name)
        setattr(module, command, dataclasses.make_dataclass(name, [], frozen=True, kw_only=True))
        sys.modules[module_name] = module
    from tensorflow_datasets.scripts.cli import main
    sys.argv[0] = "tfds"
    main.launch_cli()
    """)


def _tfds(*args, env=None) -> None:
  """`tfds ARGS` in a subprocess; fails the test with its output if it fails."""
  result = subprocess.run([sys.executable, "-c", TFDS_CLI, *map(str, args)],
                          capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, JAX_PLATFORMS="cpu", **(env or {})))
  assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]


def test_tfds_build_enwik8_and_wikitext103(tmp_path):
  """`tfds build --imports sparse_jax.data.enwik8,sparse_jax.data.wikitext103 enwik8
  wikitext103/sp330 --manual_dir M --data_dir D`: the builders registered by `--imports`,
  array_record by default, enwik8's standard 90M/5M/5M split (so the archive holds 10^8
  repetitive bytes, stored uncompressed) of which `--max_examples_per_split 1` (a TFDS debug
  option) writes each split's first 1 MB record, and WikiText-103 with a 330-piece model."""
  manual = tmp_path / "manual"
  os.makedirs(manual)
  block = wiki_like_bytes(100_000, seed=4)
  with zipfile.ZipFile(manual / enwik8.ARCHIVE, "w", compression=zipfile.ZIP_STORED) as z:
    z.writestr(enwik8.MEMBER, block * 1000)
  texts = _write_wikitext103(manual, seed=0)
  _tfds("build", "--imports", "sparse_jax.data.enwik8,sparse_jax.data.wikitext103", "enwik8",
        f"wikitext103/sp{WT_VOCAB}", "--manual_dir", manual, "--data_dir", tmp_path / "tfds",
        "--max_examples_per_split", 1)

  builder = enwik8.Enwik8(data_dir=str(tmp_path / "tfds"))
  assert builder.info.file_format.value == "array_record"
  starts = {"train": 0, "validation": 90_000_000, "test": 95_000_000}
  for split, start in starts.items():
    record = _read_bytes(builder, split)
    assert len(record) == enwik8.text_records.BYTES_PER_RECORD
    offset = start % len(block)
    assert record == (block * (2 + len(record) // len(block)))[offset:offset + len(record)]
  wt = wikitext103.Wikitext103(config=f"sp{WT_VOCAB}", data_dir=str(tmp_path / "tfds"))
  assert _read_wikitext103(wt) == texts


def test_tfds_build_arxiv_from_the_module_path(tmp_path):
  """`tfds build .../sparse_jax/data/arxiv.py --manual_dir M --data_dir D`: TFDS's registry
  has its own `scientific_papers` (ours shares its name and data dir, unregistered), so ours
  is built from its file; it prepares the arxiv config only."""
  manual = tmp_path / "manual"
  os.makedirs(manual)
  expected = _write_arxiv(manual, seed=0)
  _tfds("build", arxiv.__file__, "--manual_dir", manual, "--data_dir", tmp_path / "tfds",
        env={"TEST_CHECKSUM_URL": arxiv.URL,
             "TEST_CHECKSUM_FILE": str(manual / arxiv.ARCHIVE)})
  assert sorted(os.listdir(tmp_path / "tfds" / "scientific_papers")) == [".config", "arxiv"]
  assert _read_arxiv(arxiv.ScientificPapers(data_dir=str(tmp_path / "tfds"))) == expected
