"""Typed config sections: frozen dataclasses parsed from ml_collections configs.

Configs stay ml_collections files on the outside (command-line overrides keep working); each
module parses its section once through a `Schema` and reads typed attributes after that:

    class DenseFFConfig(FFConfig):
      d_ff: schema.PositiveInt
      dropout: schema.Probability = 0.0

`Schema.parse(cfg, path)` takes a ConfigDict, a dict or an already-parsed instance and raises
`ConfigError` naming the field (`path.name`) for an unknown field (suggesting the nearest valid
name), a missing required one, a value that does not fit the field's annotation (`int`, never
a bool; `float`, which takes ints; `str`; `bool`; `X | None`; `Literal[...]`; `tuple[...]`; a
nested `Schema`; `Annotated[T, Constraint(...)]` for ranges), and anything the section's
`check` rejects (cross-field rules). The defaults of a section live in its schema alone.

A section whose fields depend on a kind is *tagged*: `class FFConfig(Schema, tag="kind")`
declares the tag field (`kind: str`), each kind's schema subclasses it and registers with
`@FFConfig.variant("dense")`, and `FFConfig.parse` picks the subclass by the tag's value
(`default` when the tag is absent). A nested section that is absent parses as `{}`.
"""

import dataclasses
import difflib
import types
import typing
from typing import Annotated, Any, Callable, ClassVar, Literal, Mapping, Union

from ml_collections import config_dict

from sparse_jax.validation import ConfigError, require_choice


@dataclasses.dataclass(frozen=True)
class Constraint:
  """A rule on a field's value (`Annotated[int, Constraint(...)]`), described in errors."""

  holds: Callable[[Any], bool]
  description: str


PositiveInt = Annotated[int, Constraint(lambda v: v > 0, "a positive integer")]
NonNegativeInt = Annotated[int, Constraint(lambda v: v >= 0, "an integer >= 0")]
PositiveFloat = Annotated[float, Constraint(lambda v: v > 0, "a positive number")]
NonNegativeFloat = Annotated[float, Constraint(lambda v: v >= 0, "a number >= 0")]
Probability = Annotated[float, Constraint(lambda v: 0 <= v < 1, "in [0, 1)")]

_NONE = type(None)
_PLAIN = {bool: "True or False", int: "an integer", float: "a number", str: "a string"}


class _Mismatch(Exception):
  """A value does not fit an annotation (reported by the caller with the field's name)."""


def describe(hint) -> str:
  """What an annotation allows, in words: for error messages and the API reference."""
  origin, args = typing.get_origin(hint), typing.get_args(hint)
  if origin is Annotated:
    return args[1].description
  if origin is Literal:
    return f"one of {list(args)}"
  if origin in (Union, types.UnionType):
    arms = [describe(arm) for arm in args if arm is not _NONE]
    return " or ".join(arms + (["None"] if _NONE in args else []))
  if origin is tuple:
    if args[1:] == (Ellipsis,):
      return f"a tuple whose items are each {describe(args[0])}"
    return f"a tuple of {len(args)} items, each {describe(args[0])}"
  return _PLAIN[hint]


def _convert(hint, value):
  """`value` as the annotation's type (ints as floats, lists as tuples), or `_Mismatch`."""
  origin, args = typing.get_origin(hint), typing.get_args(hint)
  if origin is Annotated:
    value = _convert(args[0], value)
    if not args[1].holds(value):
      raise _Mismatch
    return value
  if origin is Literal:
    if value not in args:
      raise _Mismatch
    return value
  if origin in (Union, types.UnionType):
    if value is None and _NONE in args:
      return None
    for arm in (arm for arm in args if arm is not _NONE):
      try:
        return _convert(arm, value)
      except _Mismatch:
        pass
    raise _Mismatch
  if origin is tuple:
    items = [args[0]] * len(value) if args[1:] == (Ellipsis,) else list(args)
    if not isinstance(value, (tuple, list)) or len(items) != len(value):
      raise _Mismatch
    return tuple(_convert(item, v) for item, v in zip(items, value))
  if isinstance(value, bool) and hint is not bool:
    raise _Mismatch
  if hint is float and isinstance(value, int):
    return float(value)
  if not isinstance(value, hint):
    raise _Mismatch
  return value


def _fields_of(cfg, path: str) -> dict[str, Any]:
  """A section's fields as a dict (FieldReferences resolved)."""
  if isinstance(cfg, Schema):
    return cfg.to_dict()
  if isinstance(cfg, config_dict.ConfigDict):
    return {name: cfg[name] for name in cfg.keys()}
  if isinstance(cfg, Mapping):
    return dict(cfg)
  raise ConfigError(f"config section '{path}' must be a mapping of fields; got {cfg!r}.")


def join(path: str, name: str) -> str:
  """The path of field `name` of the section at `path` ("" is the whole config)."""
  return f"{path}.{name}" if path else name


def _is_schema(hint) -> bool:
  return isinstance(hint, type) and issubclass(hint, Schema)


@typing.dataclass_transform(kw_only_default=True, frozen_default=True)
@dataclasses.dataclass(frozen=True, kw_only=True)
class Schema:
  """A config section (module docstring): every subclass is made a frozen, kw_only dataclass
  when it is defined (as `flax.struct.PyTreeNode` does), so it carries no decorator."""

  _tag: ClassVar[str | None] = None  # The tag field of a tagged section, e.g. "kind".
  _default_tag: ClassVar[str | None] = None
  _variants: ClassVar[dict[str, type["Schema"]]] = {}

  def __init_subclass__(cls, tag: str | None = None, default: str | None = None, **kwargs):
    super().__init_subclass__(**kwargs)
    dataclasses.dataclass(frozen=True, kw_only=True)(cls)
    if tag is not None:
      cls._tag, cls._default_tag, cls._variants = tag, default, {}

  @classmethod
  def variant(cls, *tags: str) -> Callable[[type], type]:
    """Registers the decorated subclass as the schema of the tag values `tags`."""

    def register(variant: type) -> type:
      if cls._tag is None or not issubclass(variant, cls):
        raise TypeError(f"{variant.__name__} must subclass the tagged schema {cls.__name__}.")
      for tag in tags:
        if tag in cls._variants:
          raise ValueError(f"{cls.__name__}: {cls._tag}={tag!r} is registered twice.")
        cls._variants[tag] = variant
      return variant

    return register

  @classmethod
  def variants(cls) -> dict[str, type["Schema"]]:
    """Tag value -> schema, for the kinds this (tagged) schema covers."""
    return {tag: v for tag, v in cls._variants.items() if issubclass(v, cls)}

  @classmethod
  def tag_field(cls) -> str | None:
    return cls._tag

  @classmethod
  def field_names(cls) -> set[str]:
    return {field.name for field in dataclasses.fields(cls)}

  @classmethod
  def subsections(cls) -> dict[str, type["Schema"]]:
    """Field name -> schema of the nested sections of this schema and of its variants."""
    found = {}
    for schema in (cls, *cls.variants().values()):
      hints = typing.get_type_hints(schema)
      found.update({name: hint for name, hint in hints.items() if _is_schema(hint)})
    return found

  @classmethod
  def parse(cls, cfg, path: str) -> "Schema":
    """The typed, checked section `path` of a config (module docstring).

    Example:
      The `model.ff` section of a dense layer, with its defaults filled in; a misspelt field
      is named with the nearest valid one:

      >>> from sparse_jax.layers.registry import FFConfig
      >>> ff = FFConfig.parse({"kind": "dense", "d_ff": 1024}, "model.ff")
      >>> ff.d_ff, ff.dropout, ff.activation
      (1024, 0.0, 'relu')
      >>> FFConfig.parse({"kind": "dense", "d_f": 1024}, "model.ff")
      Traceback (most recent call last):
      sparse_jax.validation.ConfigError: config field 'model.ff.d_f' is unknown for model.ff.kind='dense'; did you mean 'd_ff'? Valid fields: activation, d_ff, dropout, kind.
    """
    if isinstance(cfg, cls):
      return cfg
    values = _fields_of(cfg, path)
    if cls._tag is None:
      return cls._build(values, path, context="")
    tag_path, variants = join(path, cls._tag), cls.variants()
    default = (cls._default_tag if cls._default_tag in variants
               else next(iter(variants)) if len(variants) == 1 else None)
    tag = values.setdefault(cls._tag, default)
    require_choice(tag, tag_path, variants)
    return variants[tag]._build(values, path, context=f" for {tag_path}={tag!r}")

  @classmethod
  def _build(cls, values: dict[str, Any], path: str, context: str) -> "Schema":
    hints = typing.get_type_hints(cls, include_extras=True)
    fields = {field.name: field for field in dataclasses.fields(cls)}
    for name in values:
      if name not in fields:
        raise _unknown_field(join(path, name), name, fields, context)
    kwargs = {}
    for name, field in fields.items():
      field_path, hint = join(path, name), hints[name]
      if _is_schema(hint):
        kwargs[name] = hint.parse(values.get(name, {}), field_path)
      elif name in values:
        try:
          kwargs[name] = _convert(hint, values[name])
        except _Mismatch:
          raise ConfigError(f"config field '{field_path}' must be {describe(hint)}; got "
                            f"{values[name]!r}.") from None
      elif field.default is dataclasses.MISSING:
        raise ConfigError(f"config field '{field_path}' is required{context}: "
                          f"{describe(hint)}.")
    instance = cls(**kwargs)
    instance.check(path)
    return instance

  def check(self, path: str) -> None:
    """Cross-field rules of the section at `path` (ranges go in the annotations)."""

  def to_dict(self) -> dict[str, Any]:
    """The section as plain values (nested sections as dicts), for printing and saving."""
    return dataclasses.asdict(self)


def _unknown_field(field_path: str, name: str, fields, context: str) -> ConfigError:
  nearest = difflib.get_close_matches(name, fields, n=1)
  suggestion = f"; did you mean {nearest[0]!r}?" if nearest else "."
  return ConfigError(f"config field '{field_path}' is unknown{context}{suggestion} "
                     f"Valid fields: {', '.join(sorted(fields))}.")
