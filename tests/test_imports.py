"""The package's layers import one way down, without circles, and importing it starts no JAX
backend.

Layers, lowest first (a module may import its own layer and those below it):
validation/schema <- pallas_kernels, layers, parallel, data <- models, decoding <- finetune,
aot <- training (the engine) <- tasks, config_overrides <- figures <- the `sparse_jax`
package itself (whose `load` imports the tasks on call) <- the configs and the CLIs. Read from the source with `ast`, every
import counted, also those inside functions and `TYPE_CHECKING` blocks.
"""

import ast
import importlib.util
import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROOTS = ("sparse_jax", "pallas_kernels")
LAYERS = ({"sparse_jax.validation", "sparse_jax.schema"},
          {"pallas_kernels", "sparse_jax.layers", "sparse_jax.parallel", "sparse_jax.data"},
          {"sparse_jax.models", "sparse_jax.decoding"},
          {"sparse_jax.finetune", "sparse_jax.aot"},
          {"sparse_jax.training"},
          {"sparse_jax.tasks", "sparse_jax.config_overrides"},
          {"sparse_jax.figures"},
          {"sparse_jax"},
          {"sparse_jax.configs", "sparse_jax.cli", "sparse_jax.__main__"})


def _modules() -> dict[str, str]:
  """Dotted module name -> source path, for every module of our packages."""
  found = {}
  for root in ROOTS:
    for directory, _, files in os.walk(os.path.join(REPO, root)):
      for name in files:
        if name.endswith(".py"):
          path = os.path.join(directory, name)
          dotted = os.path.relpath(path, REPO)[:-3].replace(os.sep, ".")
          found[dotted.removesuffix(".__init__")] = path
  return found


MODULES = _modules()


def imports_of(path: str) -> set[str]:
  """Our modules that the source at `path` imports (`from package import submodule` counts
  as the submodule)."""
  imported = set()
  for node in ast.walk(ast.parse(open(path, encoding="utf-8").read())):
    if isinstance(node, ast.Import):
      imported.update(alias.name for alias in node.names)
    elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
      for alias in node.names:
        child = f"{node.module}.{alias.name}"
        imported.add(child if child in MODULES else node.module)
  return {name for name in imported if name.split(".")[0] in ROOTS}


GRAPH = {module: imports_of(path) for module, path in MODULES.items()}


def layer_of(module: str) -> int:
  """The index in `LAYERS` of the longest prefix of `module` listed there."""
  parts = module.split(".")
  for i in range(len(parts), 0, -1):
    prefix = ".".join(parts[:i])
    for index, layer in enumerate(LAYERS):
      if prefix in layer:
        return index
  raise AssertionError(f"{module} is in no layer of LAYERS")


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
  """One import circle of `graph` as `[a, b, ..., a]`, or None (iterative depth-first)."""
  state = {}  # module -> "open" while on the DFS stack, "done" after.
  for start in sorted(graph):
    if start in state:
      continue
    stack = [(start, iter(sorted(graph[start])))]
    state[start] = "open"
    while stack:
      module, children = stack[-1]
      child = next(children, None)
      if child is None:
        state[module] = "done"
        stack.pop()
      elif state.get(child) == "open":
        path = [m for m, _ in stack]
        return path[path.index(child):] + [child]
      elif child not in state and child in graph:
        state[child] = "open"
        stack.append((child, iter(sorted(graph[child]))))
  return None


def test_the_checks_see_the_whole_package():
  assert len(MODULES) > 100 and "sparse_jax.tasks.runs" in GRAPH["sparse_jax.tasks"]
  assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
  assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_no_import_circle():
  assert find_cycle(GRAPH) is None


def test_no_module_imports_a_layer_above_its_own():
  upward = sorted(f"{module} -> {imported}" for module, imported_set in GRAPH.items()
                  for imported in imported_set if layer_of(imported) > layer_of(module))
  assert upward == []


def test_every_module_is_in_a_layer():
  for module in MODULES:
    layer_of(module)
  assert importlib.util.find_spec("sparse_jax.training.tasks") is None  # the tasks moved up


def test_importing_the_package_and_configs_does_not_start_jax():
  """`jax.distributed.initialize` (train.py --num_processes) must run before the XLA backend
  starts, so no module may compute with JAX at import time (a module-level `jnp.zeros` broke
  multi-process training once). The CLI programs are left out: each defines absl flags, so two
  cannot share a process (the next test starts train.py's)."""
  script = (
      "import importlib, pkgutil, sparse_jax\n"
      "from jax._src import xla_bridge\n"
      "from sparse_jax.cli import main\n"
      "for info in pkgutil.walk_packages(sparse_jax.__path__, 'sparse_jax.'):\n"
      "  if info.name not in main.COMMANDS.values():\n"
      "    importlib.import_module(info.name)\n"
      "  assert not xla_bridge.backends_are_initialized(), info.name\n")
  result = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True,
                          text=True, env=dict(os.environ, JAX_PLATFORMS="cpu"), timeout=300)
  assert result.returncode == 0, result.stderr[-1500:]


def test_starting_train_py_imports_neither_torch_nor_scipy_stats(tmp_path):
  """Start-up cost: tensorboardX imports PyTorch when installed (2.4 s on the 2-core VM) and the
  GLUE metrics scipy.stats (0.9 s); `train.py` needs neither to start. A stand-in
  `torch` that fails when imported shadows any installed one, so the check does not depend
  on whether PyTorch is installed here."""
  (tmp_path / "torch.py").write_text("raise AssertionError('torch was imported')\n")
  script = ("import sys, train\n"
            "assert 'scipy.stats' not in sys.modules, 'scipy.stats was imported'\n"
            "from sparse_jax.training.metrics_log import MetricsWriter\n"
            f"MetricsWriter({str(tmp_path / 'run')!r}).close()\n")
  env = dict(os.environ, JAX_PLATFORMS="cpu",
             PYTHONPATH=os.pathsep.join([str(tmp_path), REPO]))
  result = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True,
                          text=True, env=env, timeout=300)
  assert result.returncode == 0, result.stderr[-1500:]
  assert os.listdir(tmp_path / "run" / "tensorboard")
