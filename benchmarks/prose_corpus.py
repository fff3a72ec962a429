"""A prose corpus prepared offline: Vim's documentation, shipped by Debian's `vim-runtime`.

    python -m benchmarks.prose_corpus --out runs/prose   # writes runs/prose/vim_doc.txt

`builtin` (Python's standard-library sources) is code; the sigma-MoE comparison needs prose
as well, without a download. Vim's help files (`/usr/share/vim/vim*/doc/*.txt`, about 10 MB
in 150 files: the user manual, a book by Bram Moolenaar, and the reference manual) are the
largest body of English prose a stock Debian or Ubuntu image ships: mostly explanatory text,
with command examples in between, and written for readers rather than compilers. The files
are concatenated in sorted order (the user manual's chapters `usr_*.txt` first) into one
file, which `text_files` cuts into train / validation / test at line breaks
(`data_overrides`).
"""

import argparse
import glob
import os

from benchmarks.machine import replacing

SOURCE_GLOB = "/usr/share/vim/vim*/doc/*.txt"
FILE_NAME = "vim_doc.txt"
SPLIT_FRACTIONS = (0.9, 0.05, 0.05)


class MissingCorpusError(FileNotFoundError):
  """The source files are not on this machine; the message says how to get them."""


def source_files(pattern: str = SOURCE_GLOB) -> list[str]:
  """The help files, the user manual's chapters first, each group in name order."""
  paths = sorted(glob.glob(pattern))
  if not paths:
    raise MissingCorpusError(
        f"no files match {pattern}: the prose corpus is Vim's documentation, from the Debian "
        "package vim-runtime (`apt-get install vim-runtime`)")
  return sorted(paths, key=lambda p: (not os.path.basename(p).startswith("usr_"), p))


def prepare(out_dir: str, pattern: str = SOURCE_GLOB) -> str:
  """Writes the concatenated corpus into `out_dir` (once; kept if it exists) and returns its
  path. Each writer fills a temporary file of its own and renames it into place, so runs
  started side by side on a fresh `out_dir` neither collide nor read a partial corpus."""
  path = os.path.join(out_dir, FILE_NAME)
  if not os.path.exists(path):
    sources = source_files(pattern)
    os.makedirs(out_dir, exist_ok=True)
    with replacing(path, "wb") as out:
      for source in sources:
        with open(source, "rb") as f:
          out.write(f.read().rstrip(b"\n") + b"\n\n")
  return path


def data_overrides(path: str) -> dict:
  """`config.data` fields that train on the corpus at `path` (bytes, as `builtin`)."""
  return {"name": "text_files", "file": path, "split_fractions": SPLIT_FRACTIONS}


if __name__ == "__main__":
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--out", required=True, help="folder for the corpus file")
  written = prepare(parser.parse_args().out)
  print(f"{written}: {os.path.getsize(written):,} bytes")
