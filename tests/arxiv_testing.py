"""Small arXiv archives in the official `arxiv-dataset.zip` layout (JSON lines of papers), and
their preparation through TFDS's `scientific_papers` builder, for the data and task tests."""

import json
import os
import zipfile

import numpy as np
import pytest
from tensorflow_datasets.core.download import checksums

from sparse_jax.data import arxiv

VOCAB = 320  # The smallest SentencePiece model with byte fallback: trains in milliseconds.
WORDS = ["we", "study", "the", "spin", "@xmath0", "model", "of", "a", "lattice", "@xcite",
         "and", "find", "that", "energy", "gap", "is", "finite", ",", ".", "( 1 )", "Schrödinger"]
# Split -> number of papers, in the official file of that split.
PAPERS = {"train": 24, "validation": 3, "test": 4}
OFFICIAL_FILES = {"train": "train.txt", "validation": "val.txt", "test": "test.txt"}


def sentence(rng: np.random.Generator) -> str:
  return " ".join(rng.choice(WORDS, size=int(rng.integers(6, 20)))) + " ."


def paper(split: str, index: int, rng: np.random.Generator) -> dict:
  """One paper as its JSON line holds it: paragraphs, `<S> ... </S>`-tagged abstract
  sentences, sections."""
  paragraphs = [" ".join(sentence(rng) for _ in range(3)) for _ in range(4)]
  abstract = [sentence(rng) for _ in range(int(rng.integers(2, 5)))]
  return {"article_id": f"{split}-{index}", "article_text": paragraphs,
          "abstract_text": [f"<S> {s} </S>" for s in abstract], "labels": None,
          "section_names": ["introduction", "results"],
          "sections": [paragraphs[:2], paragraphs[2:]]}


def random_papers(seed: int = 0) -> dict[str, list[dict]]:
  rng = np.random.default_rng(seed)
  return {split: [paper(split, i, rng) for i in range(n)] for split, n in PAPERS.items()}


def write_archive(papers: dict[str, list[dict]], directory) -> str:
  """Writes `arxiv-dataset.zip` laid out as the official download into `directory`."""
  with zipfile.ZipFile(os.path.join(directory, arxiv.ARCHIVE), "w",
                       zipfile.ZIP_DEFLATED) as archive:
    for split, name in OFFICIAL_FILES.items():
      lines = "".join(json.dumps(p) + "\n" for p in papers[split])
      archive.writestr(f"arxiv-dataset/{name}", lines)
    archive.writestr("arxiv-dataset/vocab", "the 100\n")
  return str(directory)


def config(data_dir, manual_dir, **fields) -> arxiv.ArxivConfig:
  return arxiv.ArxivConfig.parse(dict(data_dir=str(data_dir), manual_dir=manual_dir,
                                      download=False, vocab_size=VOCAB, **fields), "data")


def prepare(data_dir, manual_dir) -> None:
  """Prepared records and a `VOCAB`-piece tokenizer in `data_dir`, from the test archive
  through TFDS's manual_dir lookup.

  TFDS checks a manual_dir file against the sha256 it registers for the URL; this registers
  the test archive's (the official one's is checked in test_arxiv.py) for the time of the
  preparation. Later readers find the data prepared and check nothing.
  """
  archive = os.path.join(manual_dir, arxiv.ARCHIVE)
  with pytest.MonkeyPatch.context() as patch:
    patch.setitem(arxiv.ScientificPapers.url_infos, arxiv.URL,
                  checksums.compute_url_info(archive))
    arxiv.load_split(config(data_dir, manual_dir), "train")
