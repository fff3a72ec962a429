"""`--config`'s value: a config file, or a config shipped in the package by name.

`--config=FILE[:ARG]` loads FILE as absl's config flag always has; `--config=NAME[:ARG]` loads
the packaged `sparse_jax/configs/NAME.py`, so an installed package trains without a checkout.
`configs/NAME.py[:ARG]`, the path these configs had in the repository before they moved into
the package, also names the packaged NAME when no such file exists, so existing commands keep
working. Anything else is an error that lists the packaged configs.
"""

import os
import re

import sparse_jax.configs

DIRECTORY = os.path.dirname(os.path.abspath(sparse_jax.configs.__file__))
_OLD_PATH = re.compile(r"(?:\./)?configs/(\w+)\.py")


class UnknownConfigError(ValueError):
  """`--config` names neither a file nor a packaged config."""


def packaged_names() -> list[str]:
  """The packaged configs' names: the modules of `sparse_jax/configs` that define
  `get_config` (the others, e.g. `paper_training`, are helpers those configs import)."""
  names = []
  for file in sorted(os.listdir(DIRECTORY)):
    if file.endswith(".py") and file != "__init__.py":
      with open(os.path.join(DIRECTORY, file), encoding="utf-8") as source:
        if re.search(r"^def get_config\(", source.read(), re.MULTILINE):
          names.append(file.removesuffix(".py"))
  return names


def packaged_path(name: str) -> str:
  """The file of the packaged config `name`."""
  return os.path.join(DIRECTORY, f"{name}.py")


def resolve(value: str) -> str:
  """`--config`'s value as absl's config flag loads it: unchanged when its file part exists,
  else the packaged config it names (with the same `:ARG`)."""
  path, colon, arg = value.partition(":")
  if os.path.isfile(path):
    return value
  old = _OLD_PATH.fullmatch(path)
  name = old[1] if old else path
  if name not in packaged_names():
    raise UnknownConfigError(
        f"--config={value}: {path!r} is neither a file nor a packaged config; the packaged "
        f"configs are {', '.join(packaged_names())} (NAME[:ARG], e.g. "
        f"--config=sigma_moe_paper:wt103_s), or give a config file's path.")
  return packaged_path(name) + colon + arg


def short_name(resolved: str) -> str:
  """A resolved value of a packaged config as its `NAME[:ARG]` (for printing and reports);
  a config file's value unchanged."""
  path, colon, arg = resolved.partition(":")
  if os.path.dirname(path) == DIRECTORY:
    return os.path.basename(path).removesuffix(".py") + colon + arg
  return resolved


def resolve_argv(argv: list[str]) -> list[str]:
  """`argv` with the value of `--config` (as `--config=V` or `--config V`) resolved; the
  overrides `--config.x.y=v` are left as they are."""
  resolved = list(argv)
  for i, arg in enumerate(resolved):
    for prefix in ("--config=", "-config="):
      if arg.startswith(prefix):
        resolved[i] = prefix + resolve(arg.removeprefix(prefix))
    if arg in ("--config", "-config") and i + 1 < len(resolved):
      resolved[i + 1] = resolve(resolved[i + 1])
  return resolved
