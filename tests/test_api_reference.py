"""The API reference (docs/api): Sphinx builds it with warnings as errors and runs its doctests
(slow), and the directive that lists the config schemas' fields reads each field's comments,
default and allowed values; all skipped without the `docs` extra (CI's docs step has it)."""

import os
import runpy
import subprocess
import sys
import types

import pytest

from sparse_jax import schema

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
API = os.path.join(REPO, "docs", "api")


def _extension() -> types.SimpleNamespace:
  """The directive's module (docs/api/_ext is no package), its names as attributes; it builds
  Sphinx's and docutils' nodes, so without the `docs` extra the test is skipped (CI's docs step
  runs it)."""
  pytest.importorskip("sphinx", reason="the docs extra: pip install -e '.[docs]'")
  return types.SimpleNamespace(
      **runpy.run_path(os.path.join(API, "_ext", "schema_reference.py")))


class _Tagged(schema.Schema, tag="kind", default="a"):
  """A tagged section."""

  kind: str
  # Units of the layer,
  # in two lines.
  width: schema.PositiveInt = 4  # Always even.


@_Tagged.variant("a")
class _KindA(_Tagged):
  """Kind a."""

  rate: schema.Probability = 0.5  # How often.
  name: str


def test_the_fields_of_a_schema_and_its_kinds_with_their_comments():
  extension = _extension()
  assert extension.field_comments(_Tagged) == {
      "kind": "", "width": "Units of the layer, in two lines. Always even."}
  assert extension.field_comments(_KindA) == {"rate": "How often.", "name": ""}
  assert [f.name for f in extension.shown_fields(_KindA, _Tagged)] == ["rate", "name"]
  assert [f.name for f in extension.shown_fields(_KindA, None)] == [
      "kind", "width", "rate", "name"]
  assert list(extension.sections(_Tagged, "ff")) == [
      ("ff", _Tagged, None, None), ("ff", _KindA, "a", _Tagged)]
  rows = extension.fields_table(_KindA, _Tagged).astext()
  assert "in [0, 1)" in rows and "0.5" in rows and "required" in rows and "How often." in rows
  assert "width" not in rows


@pytest.mark.parametrize("builder", ["html", "doctest"])
def test_sphinx_builds_the_reference_and_its_examples_pass(builder, tmp_path):
  pytest.importorskip("sphinx", reason="the docs extra: pip install -e '.[docs]'")
  result = subprocess.run(
      [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-b", builder, API,
       str(tmp_path)], cwd=REPO, capture_output=True, text=True, timeout=900,
      env=dict(os.environ, JAX_PLATFORMS="cpu"))
  assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
  if builder == "doctest":
    summary = (tmp_path / "output.txt").read_text()
    assert "0 failures in tests" in summary
    assert int(summary.split("Doctest summary")[1].split("tests")[0].split()[-1]) >= 30
  else:
    page = (tmp_path / "configs.html").read_text()
    assert "model.ff when model.ff.kind=" in page and "expert_dropout" in page
