"""The `schema-reference` directive: every field of a config schema (`sparse_jax.schema.Schema`)
and of its nested sections and kinds, as tables of name, allowed values, default and meaning.

    .. schema-reference:: sparse_jax.tasks.lm.LMExperiment

The allowed values are `schema.describe` of the field's annotation (the words of the config
errors); the default is the dataclass field's; the meaning is the source's comment on the
field (the comment lines right above it and the comment at the end of its line), since our
schemas document their fields with comments.
"""

import dataclasses
import importlib
import inspect
import re
import typing

from docutils import nodes
from sphinx.util.docutils import SphinxDirective

from sparse_jax import schema

_FIELD = re.compile(r"(\w+)\s*:")


def field_comments(cls: type) -> dict[str, str]:
  """Field name -> the comments on its line and the comment lines right above it, in `cls`'s
  own source."""
  lines = inspect.getsource(cls).splitlines()
  lines = lines[next(i for i, line in enumerate(lines) if line.startswith("class ")) + 1:]
  body = [line for line in lines if line.strip()]
  indent = len(body[0]) - len(body[0].lstrip()) if body else 0
  comments, above = {}, []
  for line in lines:
    text = line[indent:] if line[:indent].isspace() else None
    if text is None or text[:1].isspace():
      above = []
      continue
    if text.startswith("#"):
      above.append(text.lstrip("# "))
      continue
    match = _FIELD.match(text)
    if match and not text.startswith(("def ", "class ", "@")):
      trailing = text.partition("  # ")[2]
      comments[match[1]] = " ".join(above + ([trailing] if trailing else []))
    above = []
  return comments


def shown_fields(cls: type, base: type | None) -> list[dataclasses.Field]:
  """The fields of `cls` that its tagged section `base` lacks (every field without one)."""
  common = {f.name for f in dataclasses.fields(base)} if base else set()
  return [f for f in dataclasses.fields(cls) if f.name not in common]


def _default(field: dataclasses.Field) -> str:
  if field.default is not dataclasses.MISSING:
    return repr(field.default)
  if field.default_factory is not dataclasses.MISSING:
    return repr(field.default_factory())
  return "required"


def _cell(text: str, literal: bool = False) -> nodes.entry:
  inner = nodes.literal(text=text) if literal else nodes.Text(text)
  return nodes.entry("", nodes.paragraph("", "", inner))


def fields_table(cls: type, base: type | None = None) -> nodes.table:
  """A table of `cls`'s fields (`shown_fields`): name, allowed values, default, meaning."""
  hints = typing.get_type_hints(cls, include_extras=True)
  comments = {}
  for klass in reversed(cls.__mro__):
    if klass.__dict__.get("__annotations__"):
      comments.update(field_comments(klass))
  table, group = nodes.table(), nodes.tgroup(cols=4)
  table += group
  for width in (18, 30, 14, 38):
    group += nodes.colspec(colwidth=width)
  head = nodes.thead()
  head += nodes.row("", *(_cell(title) for title in ("field", "allowed", "default", "meaning")))
  body = nodes.tbody()
  for field in shown_fields(cls, base):
    hint = hints[field.name]
    nested = isinstance(hint, type) and issubclass(hint, schema.Schema)
    allowed = f"section {hint.__name__}" if nested else schema.describe(hint)
    default = "its own defaults" if nested else _default(field)
    meaning = comments.get(field.name) or (f"The {field.name} section (below)." if nested else "")
    body += nodes.row("", _cell(field.name, literal=True), _cell(allowed),
                      _cell(default, literal=not nested), _cell(meaning))
  group += head
  group += body
  return table


def sections(cls: type, path: str):
  """`(path, schema, tag value or None, its tagged section or None)` for `cls` and, depth
  first, each kind of it and each nested section."""
  yield path, cls, None, None
  for tag, variant in cls.variants().items():
    if variant is not cls:
      yield path, variant, tag, cls
  for name, nested in sorted(cls.subsections().items()):
    yield from sections(nested, f"{path}.{name}" if path else name)


class SchemaReference(SphinxDirective):
  """`.. schema-reference:: module.Schema`: the tables of the schema and all it nests."""

  required_arguments = 1

  def run(self) -> list[nodes.Node]:
    module, _, name = self.arguments[0].rpartition(".")
    root = getattr(importlib.import_module(module), name)
    out, seen = [], set()
    for path, cls, tag, base in sections(root, ""):
      if (path, cls) in seen or not shown_fields(cls, base):
        continue
      seen.add((path, cls))
      where = path or "(top level)"
      kind = f" when {path + '.' if path else ''}{cls.tag_field() or 'kind'}={tag!r}" if tag else ""
      title = nodes.paragraph()
      title += nodes.strong(text=f"{where}{kind}")
      title += nodes.Text(f": {cls.__module__}.{cls.__qualname__}")
      out += [title, *self.summary(cls), fields_table(cls, base)]
    return out


  @staticmethod
  def summary(cls: type) -> list[nodes.Node]:
    """The section's own docstring, a paragraph of plain text each (some sections describe
    their fields there)."""
    doc = cls.__dict__.get("__doc__")
    paragraphs = inspect.cleandoc(doc).split("\n\n") if doc else []
    return [nodes.paragraph(text=" ".join(p.split())) for p in paragraphs]


def setup(app):
  app.add_directive("schema-reference", SchemaReference)
  return {"parallel_read_safe": True, "parallel_write_safe": True}
