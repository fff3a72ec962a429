"""benchmarks/RESULTS.md stays a front page: at most RESULTS_MAX_LINES lines, its links and those
of the dated history files under benchmarks/history/ resolve (file and heading), and every JSON
file the front page names exists."""

import glob
import os
import re

import pytest

from test_readme import ROOT, broken_links, text

RESULTS = os.path.join("benchmarks", "RESULTS.md")
RESULTS_MAX_LINES = 400
HISTORY = sorted(os.path.relpath(path, ROOT)
                 for path in glob.glob(os.path.join(ROOT, "benchmarks", "history", "*.md")))

# A JSON file named on the page, from the repository root or from benchmarks/:
# `benchmarks/x.json`, `benchmarks/gpu/.../gpu_suite.json`, or a glob such as
# `benchmarks/copy_probe*.json`, which must match at least one file.
_JSON = re.compile(r"(?<![\w./*-])([\w./*-]+\.json)\b")


def named_json(page: str) -> list[str]:
  return sorted(set(_JSON.findall(text(page))))


def test_results_is_a_front_page():
  lines = text(RESULTS).count("\n")
  assert lines <= RESULTS_MAX_LINES, (
      f"RESULTS.md has {lines} lines; move dated records to benchmarks/history/")


def test_there_are_history_files():
  assert HISTORY, "benchmarks/history/ has no pages"


@pytest.mark.parametrize("page", [RESULTS] + HISTORY)
def test_relative_links_resolve(page):
  assert not broken_links(page), f"{page} links to what does not exist"


def test_every_history_file_links_back_to_the_front_page():
  for page in HISTORY:
    opening = text(page).split("\n\n", 2)[1]
    assert "../RESULTS.md" in opening, f"{page} does not open with a link to RESULTS.md"


def test_the_front_page_links_every_history_file():
  linked = {os.path.normpath(os.path.join("benchmarks", target.partition("#")[0]))
            for target in re.findall(r"\]\(([^()\s]+)\)", text(RESULTS))}
  assert not [page for page in HISTORY if page not in linked]


def test_named_json_files_exist():
  names = named_json(RESULTS)
  assert len(names) >= 10, names
  missing = [name for name in names
             if not any(glob.glob(os.path.join(ROOT, folder, name)) for folder in ("", "benchmarks"))]
  assert not missing, f"RESULTS.md names JSON files that do not exist: {missing}"
