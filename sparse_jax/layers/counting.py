"""Parameter counts of modules, for parameter-matched configs."""

import jax
from flax import nnx


def count_params(module: nnx.Module) -> int:
  """Number of scalars in the module's `nnx.Param` variables."""
  return sum(x.size for x in jax.tree.leaves(nnx.state(module, nnx.Param)))
