"""Parameter types that say what a parameter is for.

Fine-tuning selects what trains by these types (NNX filters `nnx.OfType`), never by attribute
names: a method trains its plug-ins (`PlugInParam`), the task head (`HeadParam`) and, as the
SPARTAN reference does, the backbone's LayerNorms (`LayerNormParam`). Each is an `nnx.Param`,
so everything that handles parameters (optimisers, `nnx.Param` filters, checkpoints) treats
them as parameters.
"""

from flax import nnx


class PlugInParam(nnx.Param):
  """A parameter of a plug-in inserted into a pretrained backbone (SPARTAN memory, adapter)."""


class HeadParam(nnx.Param):
  """A parameter of a task head on top of a backbone."""


class LayerNormParam(nnx.Param):
  """A LayerNorm's scale or bias."""


def retype_params(module: nnx.Module, param_type: type[nnx.Param]) -> nnx.Module:
  """`module` with each `nnx.Param` attribute of its own replaced by a `param_type` holding
  the same value and metadata (for flax modules that create plain `nnx.Param`s)."""
  for name, value in list(vars(module).items()):
    if isinstance(value, nnx.Param):
      setattr(module, name, param_type(value[...], **value.get_metadata()))
  return module
