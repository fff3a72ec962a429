"""The persistent compilation cache of `train.py` and `eval.py`: a program compiled once on a
machine is loaded, not compiled, by later runs (a resumed run, an evaluation, another seed).

It is JAX's own cache (`jax_compilation_cache_dir`): entries are keyed on the optimised
program, its compile options, the devices and the JAX version, so a changed config or model
compiles afresh. On a GPU an entry holds the executable with the GEMM tilings XLA's autotuner
chose for it. Programs that compile in under a second are not kept (JAX's default).
"""

import os

import jax

DEFAULT_DIRECTORY = "~/.cache/sparse_jax/jax"
FLAG_HELP = ("Directory of the persistent compilation cache: later runs load the compiled "
             "training and evaluation steps instead of compiling them ('' turns it off; "
             f"default: env JAX_COMPILATION_CACHE_DIR, else {DEFAULT_DIRECTORY}).")


def default_directory() -> str:
  """`JAX_COMPILATION_CACHE_DIR` when set (JAX's own variable), else `DEFAULT_DIRECTORY`."""
  return os.environ.get("JAX_COMPILATION_CACHE_DIR", DEFAULT_DIRECTORY)


def use_compilation_cache(directory: str) -> None:
  """Keeps compiled programs in `directory` (created when first written); '' turns the cache
  off, JAX's environment variable included."""
  if not directory:
    jax.config.update("jax_enable_compilation_cache", False)
    return
  jax.config.update("jax_enable_compilation_cache", True)
  jax.config.update("jax_compilation_cache_dir", os.path.expanduser(directory))
