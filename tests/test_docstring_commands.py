"""Every command in a docstring runs as written: the commands a user copies from the file they
open, as `test_readme.py` checks the README's and docs' commands.

Collected: the module docstrings (`ast.get_docstring`) of `sparse_jax/configs/*.py`,
`sparse_jax/cli/*.py`, `benchmarks/*.py` and the top-level scripts (`train.py`, `eval.py`,
`figures.py`, `glue_average.py`, wrappers of `sparse_jax/cli`). A command is a line that starts
with `python` or `sparse-jax` (its `# comment` dropped) or inline code that does; backslash
continuations are joined. `sparse-jax COMMAND` is the module `sparse_jax.cli.COMMAND`, and a
top-level script stands for the module it wraps. Optional parts in brackets are checked as if given
(`[--step=N]` is `--step=N`); `...` (more of the same arguments) is dropped.

Checked for each command:
- the script (`python X.py`) or module (`python -m M`) exists;
- scripts with absl flags (`train.py`, `eval.py`, `glue_average.py`, ...): every flag is one the
  script defines (`DEFINE_*`) or absl's; a config (`--config=NAME[:ARGS]` and its
  `--config.x.y=` overrides) is parsed as train.py parses it and validated by the task's
  schemas as the run validates it: every overridden field exists, and with `--print_params` or
  `--compile_only`, which read no data, no data source is needed;
- argparse scripts and modules (`figures.py`, the benchmarks): the command line is parsed by the
  script's own parser, abbreviations off and values taken as written (unconverted, so that
  placeholders such as `N` or `DIR` stand for values): every flag, subcommand and required
  argument;
- every argument `NAME[.py][:ARGS]` that names a file of `sparse_jax/configs/` resolves:
  `get_config(ARGS)` accepts it;
- a positional argument under `benchmarks/`, `sparse_jax/configs/`, `docs/` or `tests/` (an
  input of the
  repository) exists, a glob matching at least one file. Run folders (`runs/...`), output
  paths (`--out`, `--output`, `--workdir`) and upper-case placeholders (`DIR`, `TEXT`,
  `WORKDIR`, `FILE`, `N`) are not checked for existence;
- the cheap ones run: each distinct `train.py ... --print_params` command exits 0 and prints
  the parameter counts.

Run as a script, this file is the helper of the last two checks, in one subprocess on the CPU:
it imports what the scripts share once, then runs each script as `__main__` in a forked child
of its own (an argparse script until its parser is caught, a `--print_params` command to its
end), so that no script's JAX settings reach another's or the test process.
"""

import argparse
import ast
import dataclasses
import functools
import glob
import importlib
import json
import os
import re
import runpy
import shlex
import subprocess
import sys
import tempfile
import traceback

import pytest

from test_readme import ROOT, module_exists

# The top-level scripts and the `sparse_jax/cli` module each wraps.
SCRIPTS = {f"{name}.py": f"sparse_jax/cli/{name}.py"
           for name in ("train", "eval", "figures", "glue_average")}
FILES = [os.path.relpath(p, ROOT)
         for folder in ("sparse_jax/configs", "sparse_jax/cli", "benchmarks")
         for p in sorted(glob.glob(os.path.join(ROOT, folder, "*.py")))] + list(SCRIPTS)
# Flags after which train.py reads no data (the config is validated without data sources).
INSPECTION_FLAGS = ("--print_params", "--compile_only")
# Inputs of the repository that a positional argument may name (checked to exist).
REPO_DIRS = ("benchmarks/", "sparse_jax/configs/", "docs/", "tests/")
_CONFIG_ARG = re.compile(r"^(?:sparse_jax/configs/)?(\w+)(?:\.py)?(?::(.*))?$")


@dataclasses.dataclass(frozen=True)
class Command:
  file: str  # The file whose docstring holds it.
  text: str  # As written (continuations joined, comment dropped).
  target: str  # The script path or module name.
  as_module: bool
  args: tuple[str, ...]  # Brackets removed, `...` dropped.

  @property
  def id(self) -> str:
    return f"{self.file}: {self.text}"

  @property
  def path(self) -> str:
    """The file that runs, relative to the repository (a module of it or a script)."""
    if not self.as_module:
      return SCRIPTS.get(self.target, self.target)
    path = os.path.join(*self.target.split("."))
    return path + ".py" if os.path.isfile(os.path.join(ROOT, path + ".py")) else os.path.join(
        path, "__main__.py")


def _args(tokens: list[str]) -> tuple[str, ...]:
  args = []
  for token in tokens:
    token = token.lstrip("[").rstrip("]")
    if token and token != "...":
      args.append(token)
  return tuple(args)


def parse_command(file: str, text: str) -> Command:
  tokens = shlex.split(text)
  if tokens[0] == "sparse-jax" or tokens[1:3] == ["-m", "sparse_jax"]:
    program = tokens.index("sparse-jax" if tokens[0] == "sparse-jax" else "sparse_jax") + 1
    return Command(file, text, f"sparse_jax.cli.{tokens[program].replace('-', '_')}", True,
                   _args(tokens[program + 1:]))
  assert re.fullmatch(r"python3?", tokens[0]), text
  if tokens[1] == "-m":
    return Command(file, text, tokens[2], True, _args(tokens[3:]))
  return Command(file, text, tokens[1], False, _args(tokens[2:]))


def docstring_commands(file: str) -> list[Command]:
  """The commands of a file's module docstring (module docstring of this test)."""
  with open(os.path.join(ROOT, file), encoding="utf-8") as f:
    doc = ast.get_docstring(ast.parse(f.read())) or ""
  doc = re.sub(r"\\\n\s*", " ", doc)
  texts = [" ".join(span.split()) for span in re.findall(r"`([^`]+)`", doc)
           if re.match(r"(python3?|sparse-jax)\s", span)]
  for line in re.sub(r"`[^`]*`", "", doc).splitlines():
    if re.match(r"\s*(python3?|sparse-jax)\s", line):
      texts.append(" ".join(re.sub(r"(^|\s)#.*$", "", line).split()))
  return [parse_command(file, text) for text in dict.fromkeys(texts)]


COMMANDS = [command for file in FILES for command in docstring_commands(file)]


@functools.cache
def uses_absl(path: str) -> bool:
  """Whether a script of the repository defines absl flags (`flags.DEFINE_*`); else its command
  line is argparse's."""
  with open(os.path.join(ROOT, path), encoding="utf-8") as f:
    return bool(_defined_flags(f.read()))


def _defined_flags(source: str) -> set[str]:
  """The flags a script's `DEFINE_*("name", ...)` calls define (booleans also as `noname`)."""
  names = set()
  for node in ast.walk(ast.parse(source)):
    if not isinstance(node, ast.Call):
      continue
    func = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
    if (func.startswith("DEFINE") and node.args and isinstance(node.args[0], ast.Constant)
        and isinstance(node.args[0].value, str)):
      names.add(node.args[0].value)
      if "bool" in func:
        names.add(f"no{node.args[0].value}")
  return names


def runs_here(command: Command) -> bool:
  """A script or module of this repository (not an installed tool such as pytest)."""
  return os.path.isfile(os.path.join(ROOT, command.path))


@functools.cache
def absl_flags(path: str) -> frozenset[str]:
  """The flags a script defines (`_defined_flags`) and absl's own (`--help`, `--verbosity`,
  ...)."""
  from absl import app, flags  # pylint: disable=import-outside-toplevel
  del app  # Imported for the flags it defines (`app.run` adds the help flags).
  own = {name for module, module_flags in flags.FLAGS.flags_by_module_dict().items()
         if module.startswith("absl.") for flag in module_flags
         for name in (flag.name, *([f"no{flag.name}"] if flag.boolean else []))}
  own.update(("help", "helpshort", "helpfull", "helpxml"))
  with open(os.path.join(ROOT, path), encoding="utf-8") as f:
    return frozenset(own | _defined_flags(f.read()))


def flag_name(arg: str) -> str | None:
  return arg[2:].split("=", 1)[0] if arg.startswith("--") else None


def config_args(command: Command) -> list[str]:
  """`NAME[.py][:ARGS]` arguments (or flag values) naming a file of sparse_jax/configs/."""
  found = []
  for arg in command.args:
    value = arg.split("=", 1)[1] if arg.startswith("-") and "=" in arg else arg
    match = _CONFIG_ARG.match(value)
    if match and os.path.isfile(os.path.join(ROOT, "sparse_jax", "configs", f"{match[1]}.py")):
      found.append(value)
  return found


def resolve_config(value: str):
  """`get_config(ARGS)` of `NAME[.py][:ARGS]`, as ml_collections' config flag calls it."""
  match = _CONFIG_ARG.match(value)
  module = importlib.import_module(f"sparse_jax.configs.{match[1]}")
  return module.get_config(match[2]) if match[2] is not None else module.get_config()


def _absl_commands() -> list[Command]:
  return [c for c in COMMANDS if runs_here(c) and uses_absl(c.path)]


def _argparse_commands() -> list[Command]:
  return [c for c in COMMANDS if runs_here(c) and not uses_absl(c.path)]


def _print_params_commands() -> list[Command]:
  return list({c.args: c for c in COMMANDS
               if c.path == SCRIPTS["train.py"] and "--print_params" in c.args}.values())


@pytest.fixture(scope="module")
def outcomes():
  """What the helper (this file as a script, in a subprocess on the CPU) found: for each
  argparse command its parser's verdict, for each distinct `--print_params` command its run."""
  requests = ([["parse", c.target, c.as_module, list(c.args)] for c in _argparse_commands()]
              + [["run", c.target, c.as_module, list(c.args)] for c in _print_params_commands()])
  result = subprocess.run([sys.executable, os.path.abspath(__file__)], cwd=ROOT,
                          input=json.dumps(requests), capture_output=True, text=True,
                          env=dict(os.environ, JAX_PLATFORMS="cpu"), timeout=600)
  assert result.returncode == 0, result.stderr[-3000:]
  return {(kind, target, as_module, tuple(args)): outcome for (kind, target, as_module, args),
          outcome in zip(requests, json.loads(result.stdout))}


def test_the_docstrings_have_commands_of_every_kind():
  assert len(COMMANDS) >= 50
  texts = [c.text for c in COMMANDS]
  assert "sparse-jax train --config=moeut_paper:244m,dense --print_params" in texts
  assert len(_print_params_commands()) >= 3
  assert any(c.as_module for c in COMMANDS) and any(c.target == "sparse_jax.cli.figures"
                                                    for c in COMMANDS)
  assert any(c.target == "train.py" for c in COMMANDS)
  continued = [c for c in COMMANDS if c.file == "benchmarks/compile_targets.py"
               and "--config_targets=v5e" in c.args]
  assert continued and "moe_variants.py:wt103_s,switch" in continued[0].args


def test_brackets_comments_continuations_and_inline_code_are_read():
  assert _args(["[--step=N]", "[...]", "...", "[--experts", "32,128]"]) == (
      "--step=N", "--experts", "32,128")
  command = parse_command("x.py", "python -m benchmarks.decode --shape=17b --profile")
  assert (command.target, command.as_module, command.args) == (
      "benchmarks.decode", True, ("--shape=17b", "--profile"))
  glue_average = [c.text for c in COMMANDS if c.file == SCRIPTS["glue_average.py"]]
  assert all("#" not in text for text in glue_average) and len(glue_average) == 2


def test_the_checks_catch_a_wrong_flag_subcommand_argument_or_config():
  parser = argparse.ArgumentParser(prog="tool")
  parser.add_argument("--steps", type=int)
  sub = parser.add_subparsers(dest="figure", required=True).add_parser("cvmm")
  sub.add_argument("paths", nargs="+")
  assert _parse(parser, ["--steps=N", "cvmm", "a.json"]) == {"positionals": ["a.json"]}
  assert "unrecognized arguments: --step=5" in _parse(parser, ["--step=5", "cvmm", "a"])["error"]
  assert "unknown parser 'cvm'" in _parse(parser, ["cvm", "a"])["error"]
  assert "required: paths" in _parse(parser, ["cvmm"])["error"]
  assert parser.parse_args(["--steps=3", "cvmm", "a"]).steps == 3  # argparse as it was
  assert missing_inputs(["benchmarks/cvmm_*.json", "runs/x", "benchmarks/nothing_*.json"]) == [
      "benchmarks/nothing_*.json"]
  assert absl_positionals(("a", "--out", "b", "--noprint_params", "c", "--out=d", "e"),
                          frozenset({"out", "print_params", "noprint_params"})) == ["a", "c", "e"]
  train_flags = absl_flags(SCRIPTS["train.py"])
  assert {"config", "print_params", "noprint_params", "compile_only", "helpfull"} <= train_flags
  assert "print_param" not in train_flags and "split" in absl_flags(SCRIPTS["eval.py"])
  with pytest.raises(ValueError, match="needs a size in"):
    resolve_config("moeut_paper:244m,dnse")
  for text in ("sparse-jax glue-average runs/a --mrpc=f1",
               "python -m sparse_jax glue-average runs/a --mrpc=f1"):
    command = parse_command("x.py", text)
    assert (command.path, command.args) == ("sparse_jax/cli/glue_average.py",
                                            ("runs/a", "--mrpc=f1"))


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: c.id)
def test_the_command_names_what_exists(command):
  if command.as_module:
    assert module_exists(command.target), f"no module {command.target}"
  else:
    assert os.path.isfile(os.path.join(ROOT, command.target)), f"no script {command.target}"


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: c.id)
def test_the_configs_it_names_resolve(command):
  for value in config_args(command):
    assert resolve_config(value) is not None, value


def missing_inputs(positionals: list[str]) -> list[str]:
  """The positional arguments that name an input of the repository (under `REPO_DIRS`) that
  does not exist (a glob matches no file)."""
  return [path for path in positionals if path.startswith(REPO_DIRS)
          and not glob.glob(os.path.join(ROOT, path))]


def absl_positionals(args: tuple[str, ...], own_flags: frozenset[str]) -> list[str]:
  """The arguments that are not flags nor the value of a non-boolean flag (`--out DIR`)."""
  positionals, value_next = [], False
  for arg in args:
    name = flag_name(arg)
    if name is None and not value_next:
      positionals.append(arg)
    boolean = f"no{name}" in own_flags or name and name.startswith("no") and name[2:] in own_flags
    value_next = name is not None and "=" not in arg and name in own_flags and not boolean
  return positionals


def is_config_flag(arg: str) -> bool:
  """`--config=FILE[:ARGS]` or a `--config.x.y=v` override (ml_collections' config flag)."""
  name = flag_name(arg) or ""
  return name == "config" or name.startswith("config.")


@pytest.mark.parametrize("command", _absl_commands(), ids=lambda c: c.id)
def test_absl_scripts_parse_and_validate_the_command(command):
  """Its flags are the script's; a config (`--config`, `--config.x.y=`) parses as train.py
  parses it and passes the task's schemas, as a run for this command validates it."""
  # pylint: disable=import-outside-toplevel
  from cli_testing import cli_config
  from sparse_jax import validation
  from sparse_jax.tasks import validate_config
  own_flags = absl_flags(command.path)
  unknown = [a for a in command.args if a.startswith("-") and not (
      flag_name(a) in own_flags or "config" in own_flags and is_config_flag(a))]
  assert not unknown, f"{command.target} has no such flags: {unknown}"
  assert not missing_inputs(absl_positionals(command.args, own_flags))
  if "config" not in own_flags:
    return
  config = cli_config(*(a for a in command.args if is_config_flag(a)))
  if any(f"--{flag_name(a)}" in INSPECTION_FLAGS for a in command.args):
    with validation.inspecting():
      validate_config(config)
  else:
    validate_config(config)


@pytest.mark.parametrize("command", _argparse_commands(), ids=lambda c: c.id)
def test_argparse_scripts_parse_the_command(command, outcomes):
  outcome = outcomes["parse", command.target, command.as_module, command.args]
  assert "error" not in outcome, f"{command.target}: {outcome.get('error')}"
  assert not missing_inputs(outcome["positionals"])


@pytest.mark.parametrize("command", _print_params_commands(), ids=lambda c: c.id)
def test_print_params_commands_run(command, outcomes):
  result = outcomes["run", command.target, command.as_module, command.args]
  assert result["returncode"] == 0, result["stderr"][-3000:]
  assert re.search(r"^\w*params\w*: [\d,]+$", result["stdout"], flags=re.M), result["stdout"]


# The helper (this file run as a script: module docstring).

_SUBPARSERS = argparse._SubParsersAction  # pylint: disable=protected-access


class _Captured(Exception):

  def __init__(self, parser: argparse.ArgumentParser):
    super().__init__()
    self.parser = parser


class _ParseError(Exception):
  pass


def _run_as_main(target: str, as_module: bool, args: list[str]) -> None:
  """Runs a script (`python target args`) or module (`python -m target args`) here."""
  path = os.path.join(ROOT, target)
  sys.argv = [path if not as_module else target, *args]
  sys.path[0] = ROOT if as_module else os.path.dirname(path)
  if as_module:
    runpy.run_module(target, run_name="__main__", alter_sys=True)
  else:
    runpy.run_path(path, run_name="__main__")


def _own_parser(target: str, as_module: bool) -> argparse.ArgumentParser:
  """The parser a script or module builds when run as `__main__`, caught at its first parse."""

  def capture(self, *args, **kwargs):
    del args, kwargs
    raise _Captured(self)

  parse_known_args = argparse.ArgumentParser.parse_known_args
  argparse.ArgumentParser.parse_known_args = capture
  try:
    _run_as_main(target, as_module, [])
  except _Captured as caught:
    return caught.parser
  finally:
    argparse.ArgumentParser.parse_known_args = parse_known_args
  raise RuntimeError(f"{target} parsed no command line with argparse")


def _parsers(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
  found = [parser]
  for action in parser._actions:  # pylint: disable=protected-access
    if isinstance(action, _SUBPARSERS):
      for sub in action.choices.values():
        found += _parsers(sub)
  return found


def _parse(parser: argparse.ArgumentParser, args: list[str]) -> dict:
  """`{"positionals": [...]}` of `args` parsed by `parser` (abbreviations off, values as
  written), or `{"error": message}`."""

  def error(self, message):
    raise _ParseError(f"{self.prog}: {message}")

  saved = {name: getattr(argparse.ArgumentParser, name)
           for name in ("_get_value", "_check_value", "error")}
  argparse.ArgumentParser._get_value = lambda self, action, text: text
  argparse.ArgumentParser._check_value = lambda self, action, value: None
  argparse.ArgumentParser.error = error
  parsers = _parsers(parser)
  for each in parsers:
    each.allow_abbrev = False
  try:
    namespace = parser.parse_args(args)
  except _ParseError as e:
    return {"error": str(e)}
  finally:
    for name, method in saved.items():
      setattr(argparse.ArgumentParser, name, method)
  positionals = []
  for each in parsers:
    for action in each._actions:  # pylint: disable=protected-access
      if (not action.option_strings and action.dest != argparse.SUPPRESS
          and not isinstance(action, _SUBPARSERS)):
        value = getattr(namespace, action.dest, None)
        positionals += value if isinstance(value, list) else [value] if value else []
  return {"positionals": positionals}


def _run(target: str, as_module: bool, args: list[str]) -> dict:
  """The exit status and output of the command."""
  out, err = tempfile.TemporaryFile("w+"), tempfile.TemporaryFile("w+")
  os.dup2(out.fileno(), 1)
  os.dup2(err.fileno(), 2)
  sys.stdout, sys.stderr = out, err
  try:
    _run_as_main(target, as_module, args)
    returncode = 0
  except SystemExit as e:
    returncode = e.code if isinstance(e.code, int) else 0 if e.code is None else 1
    if isinstance(e.code, str):
      print(e.code, file=err)
  except BaseException:  # pylint: disable=broad-except
    traceback.print_exc(file=err)
    returncode = 1
  out.flush()
  err.flush()
  out.seek(0)
  err.seek(0)
  return {"returncode": returncode, "stdout": out.read(), "stderr": err.read()}


def _in_child(work) -> list | dict:
  """`work()` in a forked child, its answer (JSON) through a pipe."""
  read, write = os.pipe()
  pid = os.fork()
  if pid == 0:
    os.close(read)
    try:
      answer = work()
    except BaseException as e:  # pylint: disable=broad-except
      answer = {"error": f"running it failed: {type(e).__name__}: {e}"}
    with os.fdopen(write, "w") as f:
      json.dump(answer, f)
    os._exit(0)  # pylint: disable=protected-access
  os.close(write)
  with os.fdopen(read) as f:
    answer = f.read()
  os.waitpid(pid, 0)
  return json.loads(answer) if answer else {"error": "the helper's child process died"}


def _main() -> None:
  """Reads `[[kind, target, as_module, args], ...]` (JSON; kind "parse" or "run") and prints
  each one's outcome (`_parse`'s or `_run`'s), in order, as JSON."""
  requests = json.load(sys.stdin)
  sys.path[0] = ROOT  # Not tests/, whose packages (tests/pallas_kernels) shadow the real ones.
  stdout, sys.stdout = sys.stdout, sys.stderr  # What the scripts print stays out of the answer.
  # pylint: disable-next=import-outside-toplevel,multiple-imports,unused-import
  import flax.nnx, pallas_kernels, sparse_jax.tasks  # noqa: F401,E401  (starts no JAX backend)
  parses = {}
  for kind, target, as_module, args in requests:
    if kind == "parse":
      parses.setdefault((target, as_module), []).append(args)
  outcomes = {}
  for (target, as_module), arg_lists in parses.items():

    def parse_all(target=target, as_module=as_module, arg_lists=arg_lists):
      parser = _own_parser(target, as_module)
      return [_parse(parser, args) for args in arg_lists]

    answer = _in_child(parse_all)
    for args, outcome in zip(arg_lists, answer if isinstance(answer, list)
                             else [answer] * len(arg_lists)):
      outcomes["parse", target, as_module, tuple(args)] = outcome
  for kind, target, as_module, args in requests:
    if kind == "run":
      outcomes[kind, target, as_module, tuple(args)] = _in_child(
          lambda target=target, as_module=as_module, args=args: _run(target, as_module, args))
  stdout.write(json.dumps([outcomes[kind, target, as_module, tuple(args)]
                           for kind, target, as_module, args in requests]))


if __name__ == "__main__":
  _main()
