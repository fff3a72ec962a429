"""A prose corpus prepared offline: Vim's documentation, shipped by Debian's `vim-runtime`.

    python -m benchmarks.prose_corpus --out runs/quality   # writes runs/quality/prose_v2/*.txt

`builtin` (Python's standard-library sources) is code; the sigma-MoE comparison needs prose
as well, without a download. Vim's help files (`/usr/share/vim/vim*/doc/*.txt`) are the
largest body of English prose a stock Debian or Ubuntu image ships: the user manual (a book by
Bram Moolenaar) and the reference manual, explanatory text with command examples in between,
written for readers rather than compilers.

Not every help file is prose. The release notes `version*.txt` are mostly lists of patches
("Patch 8.2.2714 / Problem: / Solution: / Files: src/..."), 4.4 MB, nearly half the folder;
`todo.txt` is a to-do list; `help.txt`, `usr_toc.txt`, `index.txt`, `quickref.txt` and
`digraph.txt` are tables. These are left out (`NOT_PROSE`); 139 files, 4.5 MB, remain.

The splits hold whole files, chosen by a hash of the file's name (`split_of`): about 5% of the
text for validation and 2% for test, from all over the manual, and the same files on every
machine whatever else the folder holds. Version 1 of this corpus (every help file, concatenated
and cut 0.9 / 0.05 / 0.05 at line breaks) validated on the middle of `version9.txt`, a patch
list: its bits per byte measured how well a model predicts a changelog, not prose.
"""

import argparse
import glob
import hashlib
import os
import re

from benchmarks.machine import replacing

SOURCE_GLOB = "/usr/share/vim/vim*/doc/*.txt"
# Names the corpus and the runs trained on it; a new version gets new run folders.
CORPUS_ID = "prose_v2"
NOT_PROSE = re.compile(r"(version\d+|todo|help|usr_toc|index|quickref|digraph)\.txt")
SPLITS = ("train", "validation", "test")
# Of every 20 hash buckets, one goes to validation and one to test.
_HASH_BUCKETS = 20
_BUCKET_SPLITS = {0: "validation", 1: "test"}


class MissingCorpusError(FileNotFoundError):
  """The source files are not on this machine; the message says how to get them."""


def source_files(pattern: str | None = None) -> list[str]:
  """The help files that are prose, in name order (from `SOURCE_GLOB` by default)."""
  pattern = pattern or SOURCE_GLOB
  paths = sorted(glob.glob(pattern))
  if not paths:
    raise MissingCorpusError(
        f"no files match {pattern}: the prose corpus is Vim's documentation, from the Debian "
        "package vim-runtime (`apt-get install vim-runtime`)")
  return [p for p in paths if not NOT_PROSE.fullmatch(os.path.basename(p))]


def split_of(path: str) -> str:
  """The split that holds the file: a hash of its name, so that adding or removing other
  files never moves it."""
  digest = hashlib.sha256(os.path.basename(path).encode()).hexdigest()
  return _BUCKET_SPLITS.get(int(digest, 16) % _HASH_BUCKETS, "train")


def split_paths(out_dir: str) -> dict[str, str]:
  """Where `prepare` writes each split's file, by split (whether or not it has)."""
  return {split: os.path.join(out_dir, CORPUS_ID, f"{split}.txt") for split in SPLITS}


def prepare(out_dir: str, pattern: str | None = None) -> dict[str, str]:
  """Writes the three split files into `out_dir/CORPUS_ID` (once; kept if they exist) and
  returns their paths by split. Each writer fills temporary files of its own and renames them
  into place, so runs started side by side on a fresh `out_dir` neither collide nor read a
  partial corpus."""
  folder = os.path.join(out_dir, CORPUS_ID)
  paths = split_paths(out_dir)
  if all(os.path.exists(p) for p in paths.values()):
    return paths
  pattern = pattern or SOURCE_GLOB
  sources = source_files(pattern)
  by_split = {split: [s for s in sources if split_of(s) == split] for split in SPLITS}
  empty = [split for split, files in by_split.items() if not files]
  if empty:
    raise MissingCorpusError(f"the {len(sources)} prose files matching {pattern} leave the "
                             f"{', '.join(empty)} split empty: too few help files")
  os.makedirs(folder, exist_ok=True)
  for split, files in by_split.items():
    with replacing(paths[split], "wb") as out:
      for source in files:
        with open(source, "rb") as f:
          out.write(f.read().rstrip(b"\n") + b"\n\n")
  return paths


def data_overrides(paths: dict[str, str]) -> dict:
  """`config.data` fields that train on the prepared splits (bytes, as `builtin`)."""
  return {"name": "text_files", **{f"{split}_file": paths[split] for split in SPLITS}}


if __name__ == "__main__":
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--out", required=True, help="folder for the corpus")
  for split, written in prepare(parser.parse_args().out).items():
    print(f"{split}: {written}: {os.path.getsize(written):,} bytes")
