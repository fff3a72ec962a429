"""Recording what chosen layers compute while a restored model runs over data.

Figures need values that layers compute but do not return (a dense FF's hidden units, a
router's expert choices, a SPARTAN memory's parents). `recording` taps the calls of every
submodule of a given type for the duration of a `with` block, without changing the layers or
the model; `run_language_model` feeds a language model a split's segments in order, carrying
XL memory as evaluation does. Both run eagerly (no `jax.jit`): figures read a few batches.
"""

import contextlib
from collections.abc import Callable, Iterator

import numpy as np
from flax import nnx

from sparse_jax import data
from sparse_jax.data.lm_stream import eval_batches
from sparse_jax.tasks.lm import LMExperiment


def modules_of_type(model: nnx.Module, module_type: type) -> dict[str, nnx.Module]:
  """`{"blocks/2/ff": module}` for every submodule of `model` of `module_type`."""
  return {"/".join(map(str, path)): node for path, node in nnx.iter_graph(model)
          if isinstance(node, module_type)}


def in_depth_order(records: dict[str, list]) -> list[str]:
  """The paths of `records` ordered by layer: by the first index in each path
  ("blocks/3/ff", "backbone/layers/11/memory")."""
  return sorted(records, key=lambda path: next(int(part) for part in path.split("/")
                                               if part.isdigit()))


@contextlib.contextmanager
def recording(model: nnx.Module, module_type: type,
              record: Callable[[nnx.Module, tuple, object], object]
              ) -> Iterator[dict[str, list]]:
  """Yields `{path: [record(module, args, output), ...]}`, one list per `module_type`
  submodule of `model`, filled in call order while the block runs.

  The `__call__` of each such module's class is wrapped for the block's duration and restored
  after it, even on error; a call that re-enters the wrapper (a subclass calling its base's
  `__call__`) is recorded once.
  """
  modules = modules_of_type(model, module_type)
  if not modules:
    raise ValueError(f"the model has no {module_type.__name__} layer to record.")
  paths = {id(module): path for path, module in modules.items()}
  records = {path: [] for path in modules}
  active: set[int] = set()
  patched = {}
  for cls in {type(module) for module in modules.values()}:
    patched[cls] = cls.__dict__.get("__call__")
    cls.__call__ = _tapped(cls.__call__, paths, records, active, record)
  try:
    yield records
  finally:
    for cls, original in patched.items():
      if original is None:
        del cls.__call__
      else:
        cls.__call__ = original


def _tapped(call, paths, records, active, record):
  def tapped(self, *args, **kwargs):
    if id(self) not in paths or id(self) in active:
      return call(self, *args, **kwargs)
    active.add(id(self))
    try:
      output = call(self, *args, **kwargs)
    finally:
      active.discard(id(self))
    records[paths[id(self)]].append(record(self, args, output))
    return output

  return tapped


def run_language_model(model, config, splits: tuple[str, ...] = ("validation",),
                       max_batches: int | None = 8) -> int:
  """Runs a restored `TransformerLM` (`sparse_jax.load`) over the first `max_batches`
  segments of each split of `config.data` (`eval.batch_size` streams, `data.seq_len` tokens,
  XL memory of `eval.mem_len` carried from segment to segment as in evaluation). Returns the
  number of tokens fed."""
  typed = LMExperiment.parse(config, "")
  n_tokens = 0
  for split in splits:
    tokens = data.load_split(typed.data, split).tokens
    memory = model.init_memory(typed.eval.batch_size, typed.eval.mem_len)
    for batch in eval_batches(tokens, typed.eval.batch_size, typed.data.seq_len, max_batches):
      _, memory, _ = model(batch["inputs"], memory)
      n_tokens += int(np.asarray(batch["inputs"]).size)
  return n_tokens
