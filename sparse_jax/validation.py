"""Config validation: errors raised at construction, naming the field and what is allowed."""

from typing import Any, Iterable


class ConfigError(ValueError):
  """A configuration field has a value the library cannot use."""


def require(condition: bool, field: str, allowed: str, got: Any) -> None:
  """Raises `ConfigError` naming `field` unless `condition` holds."""
  if not condition:
    raise ConfigError(f"config field '{field}' must be {allowed}; got {got!r}.")


def require_positive_int(value: Any, field: str) -> None:
  require(isinstance(value, int) and not isinstance(value, bool) and value > 0,
          field, "a positive integer", value)


def require_probability(value: Any, field: str) -> None:
  """A rate in [0, 1): dropout-style probabilities."""
  require(isinstance(value, (int, float)) and 0.0 <= value < 1.0, field, "in [0, 1)", value)


def require_choice(value: Any, field: str, choices: Iterable[str]) -> None:
  choices = sorted(choices)
  require(value in choices, field, f"one of {choices}", value)
