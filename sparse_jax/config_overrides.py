"""Command-line overrides that switch a kind, e.g. `--config.data.name=text_files`.

`train.py` loads its config with ml_collections' `accept_new_attributes=True`, so an override
may add a field the config file does not have: a field of the new kind, or a typo, which the
section's schema then reports with the nearest valid name. When an override changes a tag
field (`data.name`, `model.ff.kind`, `model.memory.kind`, `model.adapters.kind`, `task.name`),
the section still holds the old kind's fields; `switch_kinds` drops those that the new kind's
schema does not know, unless they were given on the command line too (then the schema
reports them). The new kind's schema supplies the defaults of the fields left unset:

    python train.py --config.model.ff.kind=dense --config.model.ff.d_ff=1024
"""

from typing import Any, Mapping

import ml_collections

from sparse_jax.data.classification import TaskConfig
from sparse_jax.data.datasets import DataConfig
from sparse_jax.models import encoder  # noqa: F401  (registers model.kind = "encoder")
from sparse_jax.models.lm_config import ModelConfig
from sparse_jax.schema import Schema

# Top-level config sections with a schema, searched for tagged sections at any depth.
SECTIONS: dict[str, type[Schema]] = {"data": DataConfig, "model": ModelConfig,
                                     "task": TaskConfig}


def tagged_sections(sections: Mapping[str, type[Schema]]) -> list[tuple[str, type[Schema]]]:
  """`(path, tagged schema)` of every section whose kind a tag field picks, outer first."""
  found = {}

  def visit(path: str, section: type[Schema]) -> None:
    if section.tag_field():
      found[path] = section
    for name, subsection in section.subsections().items():
      visit(f"{path}.{name}", subsection)

  for name, section in sections.items():
    visit(name, section)
  return sorted(found.items(), key=lambda item: item[0].count("."))


def _section(config: ml_collections.ConfigDict, path: str) -> ml_collections.ConfigDict | None:
  node = config
  for name in path.split("."):
    if not isinstance(node, ml_collections.ConfigDict) or name not in node:
      return None
    node = node[name]
  return node if isinstance(node, ml_collections.ConfigDict) else None


def switch_kinds(config: ml_collections.ConfigDict, overrides: Mapping[str, Any],
                 sections: Mapping[str, type[Schema]] = SECTIONS) -> ml_collections.ConfigDict:
  """`config` (changed in place) after the kind switches among `overrides`.

  `overrides` maps dotted paths to the values given on the command line
  (`config_flags.get_override_values`). For each tagged section whose tag was overridden
  with a registered kind, fields the kind's schema does not know are removed unless they are
  overridden too. An unknown kind changes nothing: the section's schema reports it.
  """
  for path, schema in tagged_sections(sections):
    section = _section(config, path)
    tag = overrides.get(f"{path}.{schema.tag_field()}")
    variant = schema.variants().get(tag) if isinstance(tag, str) else None
    if section is None or variant is None:
      continue
    given = {key[len(path) + 1:].split(".")[0] for key in overrides
             if key.startswith(f"{path}.")}
    keep = variant.field_names() | given
    with section.unlocked():
      for name in [name for name in section.keys() if name not in keep]:
        del section[name]
  return config
