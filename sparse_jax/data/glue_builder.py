"""GLUE through TFDS's own `glue.Glue` builder, refusing the rows it would silently drop.

TFDS's `_generate_examples` skips every TSV row with a missing field ("Filter out corrupted
rows": a label or text column absent or empty), so a damaged file would train on fewer examples
without a word. `Glue` is that builder (same name, configs, checksums and data dir) with its
generator wrapped: once a file is read, any row it skipped raises `BadSourceError` naming the
file, the row and its text. The official GLUE files have no such rows (TFDS's example counts are
the files' row counts).
"""

import csv
import os

from etils import epath
from tensorflow_datasets.text import glue

from sparse_jax.data import sources


def _rows(data_file: str, has_header: bool) -> list[list[str]]:
  """The TSV's data rows as TFDS's reader numbers them (tab-separated, no quoting, blank lines
  skipped)."""
  with epath.Path(data_file).open() as f:
    rows = [row for row in csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE) if row]
  return rows[1:] if has_header else rows


class Glue(glue.Glue, skip_registration=True):
  """TFDS's GLUE builder; a row TFDS would drop is an error (module docstring)."""

  name = "glue"
  code_path = glue.Glue.code_path
  pkg_dir_path = glue.Glue.code_path.parent

  def _generate_examples(self, data_file, split, mrpc_files=None):
    if self.builder_config.name == "mrpc":  # Built from MRPC's own files by TFDS.
      yield from super()._generate_examples(data_file, split, mrpc_files)
      return
    kept = set()
    for key, example in super()._generate_examples(data_file, split, mrpc_files):
      kept.add(example["idx"])
      yield key, example
    has_header = not (self.builder_config.name == "cola" and split != "test")
    rows = _rows(data_file, has_header)
    dropped = [n for n in range(len(rows)) if n not in kept]
    if dropped:
      first = dropped[0]
      raise sources.BadSourceError(
          f"glue/{self.builder_config.name}: {len(dropped)} row(s) of the {split} file "
          f"{os.fspath(data_file)!r} lack a field (a label or text column missing or empty), "
          f"e.g. data row {first + 1}: {chr(9).join(rows[first])!r}. TFDS's GLUE builder would "
          f"drop them silently; fix the file or download it again.")
