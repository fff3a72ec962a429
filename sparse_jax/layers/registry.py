"""The feed-forward registry: `model.ff.kind` -> constructor.

Every feed-forward replacement (dense, top-k, PKM, the MoEs, ...) is built through here, so a
model picks its FF layer by config alone. Adding a kind means one layer file and one
`@register_ff` builder; the builder validates its own fields and names them in errors.
"""

from typing import Callable

import ml_collections
from flax import nnx

from sparse_jax import validation
from sparse_jax.layers.dense_ff import DenseFF

FFBuilder = Callable[..., nnx.Module]
_FF_BUILDERS: dict[str, FFBuilder] = {}


def register_ff(kind: str) -> Callable[[FFBuilder], FFBuilder]:
  """Registers `builder(ff_config, *, d_model, n_layers, rngs) -> module` under `kind`."""

  def decorate(builder: FFBuilder) -> FFBuilder:
    if kind in _FF_BUILDERS:
      raise ValueError(f"feed-forward kind {kind!r} is registered twice.")
    _FF_BUILDERS[kind] = builder
    return builder

  return decorate


def ff_kinds() -> list[str]:
  return sorted(_FF_BUILDERS)


def build_ff(ff: ml_collections.ConfigDict, *, d_model: int, n_layers: int,
             rngs: nnx.Rngs) -> nnx.Module:
  """Builds the FF layer that `ff.kind` names, from the other fields of `ff`."""
  validation.require_choice(ff.get("kind"), "model.ff.kind", _FF_BUILDERS)
  return _FF_BUILDERS[ff.kind](ff, d_model=d_model, n_layers=n_layers, rngs=rngs)


@register_ff("dense")
def _build_dense(ff, *, d_model, n_layers, rngs):
  validation.require_positive_int(ff.get("d_ff"), "model.ff.d_ff")
  dropout = ff.get("dropout", 0.0)
  validation.require_probability(dropout, "model.ff.dropout")
  return DenseFF(d_model, ff.d_ff, n_layers=n_layers, dropout=dropout, rngs=rngs)
