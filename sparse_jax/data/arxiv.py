"""arXiv summarisation (Scaling Transformers Sec. 4.4, Table 5): TFDS `scientific_papers/arxiv`
1.1.1 as SentencePiece ids, and the abstracts ROUGE compares answers with.

Source: the official `arxiv-dataset.zip` of Cohan et al. (2018), found in the manual_dir (the
builder's `manual_dir`, config field `data.manual_dir`; else TFDS's, from
`DownloadConfig(manual_dir=...)` or `tfds build --manual_dir`) or downloaded from `URL` by
TFDS's download manager, and checked either way against the sha256 TFDS registers for it. The
archive holds `arxiv-dataset/{train,val,test}.txt`, one JSON object per paper and line:
`article_id`, `article_text` (the body, a list of paragraphs), `abstract_text` (a list of
sentences, each wrapped in `<S> ... </S>`), `section_names`, `sections` and `labels`.

Records: TFDS's own builder (`scientific_papers_dataset_builder.Builder`) through the thin
subclass `ScientificPapers`, which overrides `_split_generators` (and keeps only the arxiv
config, so `tfds build` on this module's file prepares arxiv alone). TFDS's version calls
`dl_manager.download_and_extract`, whose extractor opens archives with `tf.io.gfile.GFile`
(`tensorflow_datasets/core/download/extractor.py`, `_open_or_pass` and `_copy`), so it needs
TensorFlow; this one downloads the same way, then extracts the three split files with
`zipfile` where TFDS would put them (`<download dir>/extracted/ZIP.<archive name>`), and
fetches the arXiv archive only (TFDS's fetches PubMed's 0.9 GB archive too, for either
config). Name, config, version, features and `_generate_examples` are TFDS's, so the records
are those of `tfds.builder("scientific_papers/arxiv:1.1.1")`, which reads them as well.

Texts: the article is TFDS's (paragraphs joined by newlines). TFDS's abstract is the
sentences with `<S>` and `</S>` removed, joined by newlines; `reference_text` also strips
each sentence's surrounding spaces and drops empty ones. That cleaned abstract is both the
target the model learns and the reference ROUGE scores against: one sentence per line, as
ROUGE-Lsum reads sentences (`sparse_jax.data.rouge_metrics`).

Tokens: a SentencePiece model (`sentencepiece_tokenizer`: unigram, identity normalisation,
the newline as a piece, byte fallback) of `vocab_size` pieces (32k in the paper) trained on
the train split's articles and abstracts, stored beside the prepared records in
`<builder data dir>/sp<vocab_size>/`. Ids follow the seq2seq contract PAD 0, EOS 1: those are
the model's `<unk>` and `<s>` ids, which encoding never emits (byte fallback spells unknown
characters as bytes, and no BOS is added), so they are free for padding and end of sequence.
An article becomes its first `max_input_len` ids (15359 in the paper) then PAD, as Trax's
`scientific_papers_terraformer.gin` appends (`AppendValue {0: [0], 1: [1]}`; `article_end="eos"`
appends EOS instead); an abstract its first `max_target_len` ids (1023) then EOS.
"""

import dataclasses
import functools
import os
import zipfile
from typing import Literal

import grain
import numpy as np
import tensorflow_datasets as tfds
from etils import epath
from tensorflow_datasets.core.download import checksums
from tensorflow_datasets.datasets.scientific_papers import scientific_papers_dataset_builder

from sparse_jax import schema, validation
from sparse_jax.data import padded_batches, sentencepiece_tokenizer, sources

URL = "https://drive.google.com/uc?id=1b3rmCSIoh6VhD4HKWjI4HOW-cSwcwbeC&export=download"
ARCHIVE = "arxiv-dataset.zip"
ARCHIVE_DIR = "arxiv-dataset"
FILES = {"train": "train.txt", "validation": "val.txt", "test": "test.txt"}
SPLITS = tuple(FILES)
VERSION = "1.1.1"  # The paper's (REFERENCE.md 2c).
PAD, EOS = padded_batches.PAD, 1
ARTICLE_ENDS = {"pad": PAD, "eos": EOS}
PAPER_VOCAB_SIZE, PAPER_MAX_INPUT_LEN, PAPER_MAX_TARGET_LEN = 32_000, 15_359, 1_023


class ArxivConfig(schema.Schema):
  """Where the data lives and how it is tokenised; defaults are the paper's (Sec. 4.4)."""

  data_dir: str | None = None  # None: ~/tensorflow_datasets.
  download: bool = True  # False: the archive must be in manual_dir (or the data prepared).
  manual_dir: str | None = None  # None: <data_dir>/downloads/manual.
  vocab_size: int = PAPER_VOCAB_SIZE  # SentencePiece pieces.
  max_input_len: schema.PositiveInt = PAPER_MAX_INPUT_LEN  # Article ids kept before EOS.
  max_target_len: schema.PositiveInt = PAPER_MAX_TARGET_LEN  # Abstract ids kept before EOS.
  max_examples: schema.PositiveInt | None = None  # The first N records of a split; None: all.
  # The id after an article's last: "pad" (Trax's gin; the article then has no end marker, as
  # padding is dropped in the concatenation) or "eos".
  article_end: Literal[tuple(ARTICLE_ENDS)] = "pad"

  def check(self, path: str) -> None:
    minimum = sentencepiece_tokenizer.MIN_VOCAB_SIZE
    validation.require(self.vocab_size >= minimum, schema.join(path, "vocab_size"),
                       f"an integer >= {minimum}", self.vocab_size)

  def resolved_manual_dir(self) -> str:
    data_dir = self.data_dir or tfds.core.constants.DATA_DIR
    return self.manual_dir or os.path.join(data_dir, "downloads", "manual")


def extract_splits(archive: epath.Path, destination: epath.Path) -> epath.Path:
  """Extracts the three split files of `archive` under `destination` (once), returns it.

  Written to a temporary sibling and renamed, so an interrupted extraction is redone.
  """
  if destination.exists():
    return destination
  members = [f"{ARCHIVE_DIR}/{name}" for name in FILES.values()]
  try:
    with zipfile.ZipFile(archive) as zipped:
      missing = sorted(set(members) - set(zipped.namelist()))
      if missing:
        raise sources.BadSourceError(
            f"arxiv: archive {os.fspath(archive)!r} lacks {missing}; expected the official "
            f"{ARCHIVE} from {URL}.")
      temporary = destination.parent / f"{destination.name}.incomplete"
      for member in members:
        zipped.extract(member, temporary)
  except zipfile.BadZipFile as e:
    raise sources.BadSourceError(
        f"arxiv: {os.fspath(archive)!r} is not a complete zip archive ({e}); re-download it "
        f"from {URL}.") from e
  temporary.rename(destination)
  return destination


class ScientificPapers(scientific_papers_dataset_builder.Builder, skip_registration=True):
  """TFDS's `scientific_papers` builder, config `arxiv`, prepared without TensorFlow.

  Overrides `_split_generators` (module docstring); keeps TFDS's name, checksums and
  metadata (`code_path`, `pkg_dir_path`), so it writes to and reads from the same
  `<data_dir>/scientific_papers/arxiv/1.1.1` as TFDS's own builder.
  """

  name = "scientific_papers"
  code_path = scientific_papers_dataset_builder.Builder.code_path
  pkg_dir_path = scientific_papers_dataset_builder.Builder.code_path.parent
  # Only `arxiv` (so `tfds build` on this module prepares arxiv alone, not pubmed too).
  BUILDER_CONFIGS = [config for config in scientific_papers_dataset_builder.Builder.BUILDER_CONFIGS
                     if config.name == "arxiv"]

  MANUAL_DOWNLOAD_INSTRUCTIONS = f"Put {ARCHIVE} (from {URL}) into the manual_dir."

  def __init__(self, *, manual_dir: str | None = None, download: bool = True,
               config: str | tfds.core.BuilderConfig | None = None, version: str | None = None,
               file_format: str | None = sources.FILE_FORMAT, **kwargs):
    """`manual_dir` None: TFDS's (`sources.resolve_manual_dir`). `config` and `version` may
    only name what this builder prepares, `arxiv` and `VERSION` (`tfds build` passes them)."""
    config_name = config if config is None or isinstance(config, str) else config.name
    if config_name not in (None, "arxiv"):
      raise ValueError(f"arxiv: this builder prepares the config 'arxiv' only, not "
                       f"{config_name!r} (TFDS's own scientific_papers builder, which needs "
                       f"TensorFlow, prepares pubmed).")
    if version not in (None, VERSION):
      raise ValueError(f"arxiv: this builder prepares version {VERSION} only, not {version!r}.")
    self._manual_dir, self._download = manual_dir, download
    super().__init__(config="arxiv", version=VERSION, file_format=file_format, **kwargs)

  def _manual_archive(self, path: epath.Path) -> epath.Path:
    """`path` after checking its size and sha256 against those TFDS registers for `URL`, as
    TFDS's download manager checks a file in its own manual_dir (which ours may not be)."""
    expected = (self.url_infos or {}).get(URL)
    if expected is not None:
      found = checksums.compute_url_info(path)
      if (found.size, found.checksum) != (expected.size, expected.checksum):
        raise sources.BadSourceError(
            f"arxiv: {os.fspath(path)!r} is not the official archive ({found.size:,} bytes, "
            f"sha256 {found.checksum}; expected {expected.size:,} bytes, sha256 "
            f"{expected.checksum}); re-download it from {URL}.")
    return path

  def _archive(self, dl_manager: tfds.download.DownloadManager) -> epath.Path:
    """The archive: from the manual_dir (`sources.resolve_manual_dir`) or downloaded by
    TFDS's download manager, its sha256 checked either way."""
    manual_dir = sources.resolve_manual_dir(self._manual_dir, dl_manager)
    where = (f"arxiv: source archive {ARCHIVE!r} not found in manual_dir {manual_dir!r}. "
             f"Download it from {URL} and put it there (config field data.manual_dir, or "
             f"TFDS's DownloadConfig(manual_dir=...) / `tfds build --manual_dir`)")
    if manual_dir and os.path.isfile(os.path.join(manual_dir, ARCHIVE)):
      return self._manual_archive(epath.Path(manual_dir) / ARCHIVE)
    if not self._download:
      raise sources.MissingSourceError(where + "; downloading is off (data.download=False).")
    try:
      return dl_manager.download(URL)
    except Exception as e:  # Any network, HTTP or checksum failure: say where to put it.
      raise sources.MissingSourceError(f"{where}; downloading it failed: {e}") from e

  def _split_generators(self, dl_manager):
    archive = self._archive(dl_manager)
    extracted = extract_splits(archive,
                               dl_manager.download_dir / "extracted" / f"ZIP.{archive.name}")
    return [tfds.core.SplitGenerator(
        name=split, gen_kwargs={"path": os.fspath(extracted / ARCHIVE_DIR / name)})
            for split, name in FILES.items()]


def prepared_builder(cfg: ArxivConfig) -> ScientificPapers:
  """The builder, its array_record files prepared in data_dir (once: later calls reuse them)."""
  manual_dir = cfg.resolved_manual_dir()
  builder = ScientificPapers(manual_dir=manual_dir, download=cfg.download,
                             data_dir=cfg.data_dir, file_format="array_record")
  # TFDS's copies on GCS are TFRecord files, never array_record: don't look for them.
  builder.download_and_prepare(download_config=tfds.download.DownloadConfig(
      manual_dir=manual_dir, try_download_gcs=False))
  return builder


def _text(value) -> str:
  """A Text feature as str: array_record records hold UTF-8 bytes."""
  return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def reference_text(abstract: str) -> str:
  """TFDS's abstract (`<S>`/`</S>` already removed) as one stripped sentence per line."""
  return "\n".join(line.strip() for line in abstract.split("\n") if line.strip())


def _training_lines(records):
  """The lines of every article and abstract, in record order (the tokenizer's corpus)."""
  for record in records:
    yield from _text(record["article"]).split("\n")
    yield from reference_text(_text(record["abstract"])).split("\n")


def tokenizer_path(builder: ScientificPapers, vocab_size: int) -> str:
  return sentencepiece_tokenizer.model_path(
      os.path.join(os.fspath(builder.data_dir), f"sp{vocab_size}"))


def _tokenizer(builder: ScientificPapers, vocab_size: int) -> sentencepiece_tokenizer.Tokenizer:
  """The prepared data's SentencePiece model of `vocab_size` pieces, trained on the train split
  the first time (into a temporary file then renamed, so an interrupted run trains again)."""
  path = tokenizer_path(builder, vocab_size)
  if not os.path.isfile(path):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    temporary = f"{path}.incomplete"
    sentencepiece_tokenizer.train(_training_lines(builder.as_data_source("train")), vocab_size,
                                  temporary)
    os.replace(temporary, path)
  return sentencepiece_tokenizer.Tokenizer(path)


def load_tokenizer(cfg: ArxivConfig) -> sentencepiece_tokenizer.Tokenizer:
  """Prepares the data if needed; its SentencePiece model of `cfg.vocab_size` pieces."""
  return _tokenizer(prepared_builder(cfg), cfg.vocab_size)


def encode(tokenizer: sentencepiece_tokenizer.Tokenizer, text: str, max_len: int,
           end: int = EOS) -> np.ndarray:
  """`int32 [min(n, max_len) + 1]`: the first `max_len` ids of `text`, then `end`."""
  return np.append(tokenizer.encode_lines([text])[:max_len], end).astype(np.int32)


def encode_record(record: dict, *, tokenizer: sentencepiece_tokenizer.Tokenizer,
                  max_input_len: int, max_target_len: int,
                  article_end: int = PAD) -> dict[str, np.ndarray]:
  """`{"inputs": article ids + article_end, "targets": reference abstract ids + EOS}`."""
  return {"inputs": encode(tokenizer, _text(record["article"]), max_input_len, article_end),
          "targets": encode(tokenizer, reference_text(_text(record["abstract"])),
                            max_target_len)}


def _reference(record: dict) -> str:
  return reference_text(_text(record["abstract"]))


def max_lengths(cfg: ArxivConfig) -> tuple[int, int]:
  """The longest `(inputs, targets)` in ids, the end id included: the padded shape."""
  return cfg.max_input_len + 1, cfg.max_target_len + 1


@dataclasses.dataclass(frozen=True)
class ArxivSplit:
  """A split, read lazily from the prepared records: element i of each belongs together."""

  examples: grain.MapDataset  # {"inputs": int32[n <= S], "targets": int32[m <= T]} (`encode_record`).
  references: grain.MapDataset  # str: the abstract ROUGE scores against (`reference_text`).
  tokenizer: sentencepiece_tokenizer.Tokenizer  # Decodes answers (`decode_answer`).


def load_split(cfg: ArxivConfig, split: str) -> ArxivSplit:
  """Prepares the data and tokenizer if needed; the first `cfg.max_examples` records of
  `split` (all when None), in the prepared records' order."""
  validation.require_choice(split, "split", SPLITS)
  builder = prepared_builder(cfg)
  tokenizer = _tokenizer(builder, cfg.vocab_size)
  records = grain.MapDataset.source(builder.as_data_source(split))
  if cfg.max_examples is not None:
    records = records[:cfg.max_examples]
  encode_fn = functools.partial(encode_record, tokenizer=tokenizer,
                                max_input_len=cfg.max_input_len,
                                max_target_len=cfg.max_target_len,
                                article_end=ARTICLE_ENDS[cfg.article_end])
  return ArxivSplit(records.map(encode_fn), records.map(_reference), tokenizer)


def decode_answer(tokenizer: sentencepiece_tokenizer.Tokenizer, ids) -> str:
  """The text of a generated answer: its ids before the first EOS or PAD, decoded.

  Ids the tokenizer lacks are dropped: a small corpus may give fewer pieces than
  `vocab_size`, the model's output size, and an untrained model can emit those ids.
  """
  ids = np.asarray(ids)
  ends = np.flatnonzero((ids == EOS) | (ids == PAD))
  ids = ids[:ends[0]] if len(ends) else ids
  return tokenizer.decode(ids[ids < tokenizer.vocab_size])
