"""Config validation: errors raised at construction, naming the field and what is allowed.

Most rules hold whatever a run does. A rule on where the data comes from (which files to read)
matters only to a mode that reads data: such rules use `require_data_source`, which
`inspecting()` turns off for the modes that build or compile the model and read no data
(`train.py --print_params`, `--compile_only`). Every other rule still holds there."""

import contextlib
import contextvars
from typing import Any, Iterable, Iterator


class ConfigError(ValueError):
  """A configuration field has a value the library cannot use."""


_READS_DATA = contextvars.ContextVar("sparse_jax_validation_reads_data", default=True)


def require(condition: bool, field: str, allowed: str, got: Any) -> None:
  """Raises `ConfigError` naming `field` unless `condition` holds."""
  if not condition:
    raise ConfigError(f"config field '{field}' must be {allowed}; got {got!r}.")


def reads_data() -> bool:
  """Whether the config being validated is for a mode that reads data (not `inspecting()`)."""
  return _READS_DATA.get()


@contextlib.contextmanager
def inspecting() -> Iterator[None]:
  """Validates for a mode that reads no data (printing parameter counts, compiling for a
  target): `require_data_source` rules are skipped inside; every other rule holds."""
  token = _READS_DATA.set(False)
  try:
    yield
  finally:
    _READS_DATA.reset(token)


def require_data_source(condition: bool, field: str, allowed: str, got: Any) -> None:
  """`require` for a rule that only reading the data needs (e.g. which files hold the text);
  skipped while `inspecting()`."""
  if reads_data():
    require(condition, field, allowed, got)


def require_positive_int(value: Any, field: str) -> None:
  require(isinstance(value, int) and not isinstance(value, bool) and value > 0,
          field, "a positive integer", value)


def require_probability(value: Any, field: str) -> None:
  """A rate in [0, 1): dropout-style probabilities."""
  require(isinstance(value, (int, float)) and 0.0 <= value < 1.0, field, "in [0, 1)", value)


def require_choice(value: Any, field: str, choices: Iterable[str]) -> None:
  choices = sorted(choices)
  require(value in choices, field, f"one of {choices}", value)
