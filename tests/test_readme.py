"""The README's code is true of the package: its snippets' imports and every dotted name it
mentions (`sparse_jax.models.Encoder`, `finetune.methods.trainable_filter`, ...) resolve."""

import importlib
import os
import re

import pytest

README = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "README.md")
# Packages the README names without the `sparse_jax.` prefix.
SUBPACKAGES = ("models", "layers", "training", "finetune", "data", "parallel", "decoding")


def readme() -> str:
  with open(README, encoding="utf-8") as f:
    return f.read()


def python_blocks() -> list[str]:
  return re.findall(r"```python\n(.*?)```", readme(), flags=re.S)


def import_lines() -> list[str]:
  return [line.strip() for block in python_blocks() for line in block.splitlines()
          if re.match(r"\s*(from \S+ import |import )", line)]


def is_config_field(parts: list[str]) -> bool:
  """`data.batch_size` is a config field (section.field), `data.spec` could be either; a
  package path has a module or a class after its first part."""
  return len(parts) == 2 and parts[1].islower() and parts[0] == "data"


def dotted_names() -> list[str]:
  """Backticked dotted names rooted in our packages, e.g. `models.hf_roberta.load_encoder`
  (calls and arguments stripped)."""
  names = set()
  for match in re.findall(r"`([A-Za-z_][\w.]*\.[A-Za-z_]\w*)[(`\[]", readme()):
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


def test_the_readme_has_snippets_and_names_to_check():
  assert len(import_lines()) >= 5 and len(dotted_names()) >= 10


@pytest.mark.parametrize("line", import_lines())
def test_snippet_imports_work(line):
  exec(line, {})  # pylint: disable=exec-used


@pytest.mark.parametrize("name", dotted_names())
def test_named_objects_exist(name):
  assert resolve(name) is not None
