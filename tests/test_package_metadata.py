"""The package's version is written once (`sparse_jax.__version__`, which pyproject.toml reads
and CHANGELOG.md's newest section names), and its licence is Apache-2.0 in pyproject.toml and
LICENSE. (tests/test_installed_package.py checks the built wheel's metadata.)"""

import os
import re
import tomllib

import sparse_jax

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _read(name: str) -> str:
  with open(os.path.join(REPO, name), encoding="utf-8") as f:
    return f.read()


def test_the_version_is_written_once():
  project = tomllib.loads(_read("pyproject.toml"))
  assert "version" not in project["project"] and "version" in project["project"]["dynamic"]
  assert project["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "sparse_jax.__version__"}
  assert re.fullmatch(r"\d+\.\d+\.\d+", sparse_jax.__version__)


def test_the_changelog_starts_at_the_current_version():
  versions = re.findall(r"^## (\S+)", _read("CHANGELOG.md"), flags=re.M)
  assert versions and versions[0] == sparse_jax.__version__
  assert versions[-1] == "0.1.0"


def test_the_licence_is_apache_2():
  project = tomllib.loads(_read("pyproject.toml"))["project"]
  assert project["license"] == "Apache-2.0" and project["license-files"] == ["LICENSE"]
  licence = _read("LICENSE")
  assert licence.startswith("Copyright 2026 The sparse_jax Authors.")
  assert "Apache License\n                           Version 2.0, January 2004" in licence
  assert "END OF TERMS AND CONDITIONS" in licence
