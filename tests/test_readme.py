"""The README and the pages of docs/ are true of the repository: their snippets' imports run,
every dotted name they mention (`sparse_jax.models.Encoder`,
`finetune.methods.trainable_filter`, ...) resolves, every command names a script, module or
config that exists, every relative link points to a file (and heading) that exists, the README
stays a front page, and no page states how long the test suite takes (timings live in
benchmarks/RESULTS.md, with their command, machine and date). The commands in the docstrings of
the configs, benchmarks and scripts are checked, and the cheap ones run, by
test_docstring_commands.py, which shares `ROOT` and `module_exists` with this file."""

import functools
import glob
import importlib
import importlib.util
import os
import re

import pytest

from sparse_jax.cli import config_names, main

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = "README.md"
# Every page checked, relative to ROOT: the README and docs/*.md.
PAGES = [README] + sorted(os.path.relpath(path, ROOT)
                          for path in glob.glob(os.path.join(ROOT, "docs", "*.md")))
README_MAX_LINES = 250
# Packages the pages name without the `sparse_jax.` prefix.
SUBPACKAGES = ("models", "layers", "training", "tasks", "finetune", "data", "parallel",
               "decoding")

_FENCED = re.compile(r"^```(\w*)\n(.*?)^```", flags=re.S | re.M)


@functools.cache
def text(page: str) -> str:
  with open(os.path.join(ROOT, page), encoding="utf-8") as f:
    return f.read()


def code_blocks(page: str, *languages: str) -> list[str]:
  return [body for lang, body in _FENCED.findall(text(page)) if lang in languages]


def prose(page: str) -> str:
  """The page without its fenced code blocks."""
  return _FENCED.sub("", text(page))


def import_lines(page: str) -> list[str]:
  return [line.strip() for block in code_blocks(page, "python") for line in block.splitlines()
          if re.match(r"\s*(from \S+ import |import )", line)]


def is_config_field(parts: list[str]) -> bool:
  """`data.batch_size` is a config field (section.field), `data.spec` could be either; a
  package path has a module or a class after its first part."""
  return len(parts) == 2 and parts[1].islower() and parts[0] == "data"


def dotted_names(page: str) -> list[str]:
  """Backticked dotted names rooted in our packages, e.g. `models.hf_roberta.load_encoder`
  (calls and arguments stripped)."""
  names = set()
  for match in re.findall(r"`([A-Za-z_][\w.]*\.[A-Za-z_]\w*)[(`\[]", text(page)):
    parts = match.split(".")
    if parts[0] in ("sparse_jax", "pallas_kernels"):
      names.add(match)
    elif parts[0] in SUBPACKAGES and not is_config_field(parts):
      names.add(f"sparse_jax.{match}")
  return sorted(names)


def resolve(dotted: str):
  """The object a dotted name refers to: the longest importable module, then attributes."""
  parts = dotted.split(".")
  for i in range(len(parts), 0, -1):
    try:
      obj = importlib.import_module(".".join(parts[:i]))
    except ModuleNotFoundError:
      continue
    for attr in parts[i:]:
      obj = getattr(obj, attr)
    return obj
  raise ModuleNotFoundError(dotted)


def commands(page: str) -> list[str]:
  """Shell text that may run a command: the bash/sh blocks and the inline code of the prose."""
  return code_blocks(page, "bash", "sh") + re.findall(r"`([^`]+)`", prose(page))


def missing_commands(page: str) -> list[str]:
  """`python X.py`, `python -m M`, `python -m pytest PATH`, `sparse-jax COMMAND`, a config
  (`--config=NAME[:ARG]`, a packaged config, or `--config=FILE[:ARG]`) and a config file
  `[sparse_jax/]configs/NAME.py` naming a file, module or config that does not exist."""
  missing = []
  for shell in commands(page):
    for match in re.finditer(r"(?<![\w./-])python3?[ \t]+(-m[ \t]+)?([\w./:-]+)(.*)", shell):
      as_module, target, rest = match.groups()
      if as_module:
        if not module_exists(target):
          missing.append(f"python -m {target}")
        elif target == "pytest":
          missing += [f"pytest {path}" for path in re.findall(r"(?<![\w=-])(tests/\S+)", rest)
                      if not os.path.exists(os.path.join(ROOT, path.split("::")[0]))]
      elif target.endswith(".py") and not os.path.isfile(os.path.join(ROOT, target)):
        missing.append(f"python {target}")
    missing += [f"sparse-jax {name}"
                for name in re.findall(r"(?<![\w-])sparse-jax[ \t]+(\S+)", shell)
                if name not in main.COMMANDS]
    missing += [f"--config={value}" for value in re.findall(r"--config=([^\s:]+)", shell)
                if not is_config(value)]
  config_files = re.findall(r"(?<![\w/])(?:sparse_jax/)?configs/\w+\.py", text(page))
  missing += [path for path in config_files if not os.path.isfile(os.path.join(ROOT, path))]
  return sorted(set(missing))


def is_config(value: str) -> bool:
  """A `--config` value (before any `:ARG`) that names a file, a packaged config (train.py's
  NAME, the benchmarks' NAME.py), or is a placeholder (`CONFIG`, `...`)."""
  return (os.path.isfile(os.path.join(ROOT, value)) or value in ("...", value.upper())
          or value.removesuffix(".py") in config_names.packaged_names())


def module_exists(module: str) -> bool:
  """A module of this repository (a file or a package's __main__) or an installed one."""
  path = os.path.join(ROOT, *module.split("."))
  if os.path.isdir(os.path.join(ROOT, module.split(".")[0])):
    return os.path.isfile(path + ".py") or os.path.isfile(os.path.join(path, "__main__.py"))
  return importlib.util.find_spec(module) is not None


def heading_anchors(page: str) -> set[str]:
  """GitHub's anchors of a Markdown file's headings: lower case, punctuation other than `-`
  and `_` dropped, spaces as `-`, repeats numbered."""
  anchors, seen = set(), {}
  for heading in re.findall(r"^#{1,6}[ \t]+(.+?)[ \t#]*$", prose(page), flags=re.M):
    anchor = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
    count = seen.get(anchor, 0)
    seen[anchor] = count + 1
    anchors.add(anchor if count == 0 else f"{anchor}-{count}")
  return anchors


def broken_links(page: str) -> list[str]:
  """Relative links `[text](path#anchor)` whose file, or whose heading in a Markdown file,
  does not exist (web links are not followed)."""
  broken = []
  for target in re.findall(r"\]\(([^()\s]+)\)", prose(page)):
    if re.match(r"[a-z]+:", target):
      continue
    path, _, anchor = target.partition("#")
    linked = os.path.normpath(os.path.join(os.path.dirname(page), path)) if path else page
    if not os.path.exists(os.path.join(ROOT, linked)):
      broken.append(target)
    elif anchor and linked.endswith(".md") and anchor not in heading_anchors(linked):
      broken.append(target)
  return broken


_DURATION = re.compile(
    r"\b\d+(?:\.\d+)?\s*(?:ms|s|secs?|seconds?|mins?|minutes?|h|hrs?|hours?)\b"
    r"|\b(?:a|an|one|two|few|several)\s+(?:seconds?|minutes?|hours?)\b", flags=re.I)
_TEST_RUN = re.compile(r"\b(?:pytest|test suite|the suite|passed|tests? (?:took|takes|ran|run)"
                       r"|(?:the|our) tests)\b", flags=re.I)


def duration_statements(page: str) -> list[str]:
  """Paragraphs (or table rows) that speak of running the tests and state a duration."""
  chunks = [chunk for paragraph in re.split(r"\n\s*\n", text(page))
            for chunk in (paragraph.splitlines() if paragraph.lstrip().startswith("|")
                          else [paragraph])]
  return [" ".join(chunk.split())[:160] for chunk in chunks
          if _TEST_RUN.search(chunk) and _DURATION.search(chunk)]


def _cases(collect) -> list:
  return [pytest.param(page, item, id=f"{page}:{item}") for page in PAGES
          for item in collect(page)]


def test_the_pages_have_snippets_and_names_to_check():
  assert len(import_lines(README)) >= 5
  assert sum(len(dotted_names(page)) for page in PAGES) >= 10
  assert len(PAGES) > 1, "docs/ has no pages"


@pytest.mark.parametrize("page,line", _cases(import_lines))
def test_snippet_imports_work(page, line):
  del page
  exec(line, {})  # pylint: disable=exec-used


@pytest.mark.parametrize("page,name", _cases(dotted_names))
def test_named_objects_exist(page, name):
  del page
  assert resolve(name) is not None


@pytest.mark.parametrize("page", PAGES)
def test_commands_name_files_that_exist(page):
  assert not missing_commands(page), f"{page} names what does not exist"


def test_the_command_check_catches_a_wrong_config_or_command(tmp_path):
  page = tmp_path / "page.md"
  page.write_text("```bash\npython train.py --config=sigma_moe_paper:wt103_s\n"
                  "python train.py --config=sigma_moe_papr:wt103_s\nsparse-jax trian\n"
                  "sparse-jax eval --workdir=runs/x\n```\nSee `configs/default.py`, "
                  "`sparse_jax/configs/default.py` and `--config=tests/aot/tiny_moe_config.py`.\n")
  assert missing_commands(str(page)) == [
      "--config=sigma_moe_papr", "configs/default.py", "sparse-jax trian"]


@pytest.mark.parametrize("page", PAGES)
def test_relative_links_point_to_files_that_exist(page):
  assert not broken_links(page), f"{page} links to what does not exist"


@pytest.mark.parametrize("page", PAGES)
def test_no_page_states_how_long_the_tests_take(page):
  assert not duration_statements(page), (
      f"{page}: timings belong in benchmarks/RESULTS.md (with command, machine and date)")


def test_the_readme_is_a_front_page():
  lines = text(README).count("\n")
  assert lines <= README_MAX_LINES, f"README.md has {lines} lines; the manual goes in docs/"


def test_every_docs_page_is_linked_from_the_readme():
  linked = {os.path.normpath(target.partition("#")[0])
            for target in re.findall(r"\]\(([^()\s]+)\)", prose(README))}
  assert not [page for page in PAGES[1:] if page not in linked]


def test_the_suite_is_run_in_two_steps_and_the_slow_list_names_real_tests(pytestconfig):
  """The README runs the quick tests and the `slow` (end-to-end) ones as two commands, CI runs
  both, and each `SLOW_TESTS` entry names a test file (and test) that exists: a renamed file
  would otherwise move its tests back into the quick step unnoticed."""
  commands = ('python -m pytest -n 2 -m "not slow" tests', "python -m pytest -n 2 -m slow tests")
  for command in commands:
    assert command in text(README) and command in text(".ci/run"), command
  # The module pytest loaded, registered by its path (`import conftest` could find
  # tests/layers/conftest.py's instead).
  conftest = pytestconfig.pluginmanager.get_plugin(os.path.join(ROOT, "tests", "conftest.py"))
  for entry in conftest.SLOW_TESTS:
    path, _, name = entry.partition("::")
    assert os.path.isfile(os.path.join(ROOT, path)), entry
    assert not name or f"def {name}" in text(path), entry
