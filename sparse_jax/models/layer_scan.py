"""The decoder's layers under one `jax.lax.scan` (`model.scan_layers`): one layer's program
compiled, not `n_layers` of them.

Unrolled, every layer is traced and compiled apart, so XLA's work grows with `n_layers` (WT-103
S's 16-layer training step took 38-120 s to compile on an H100/H200). Scanned, XLA compiles one
layer's program and runs it in a loop; what still grows with depth is the work per parameter
array outside it (the optimiser's update, the stacking below). The blocks stay separate
modules, so parameters, checkpoints and per-layer names are the same either way: their states
are stacked when the model is called, and the scan's body rebuilds one layer from its slice
(`nnx.merge`).

The computation is the unrolled one, random draws included: every random stream in a block is
the block's own (forked at construction, reseeded per step by `models.rngs.reseed`), so a
layer draws from its own key and count wherever it runs. After the scan the blocks' streams
are advanced as the unrolled loop would leave them.

MoEUT's shared layers (`model.layer_groups` G < `n_layers`: layer i runs block i % G) scan over
the `n_layers / G` repeats of the G blocks, whose parameters are the same at every repeat and
whose random streams are carried from one repeat to the next.
"""

from collections.abc import Callable

import jax
import jax.numpy as jnp
from flax import nnx

BlockCall = Callable[..., tuple[jax.Array, dict]]


def _split(block: nnx.Module):
  """`(graphdef, params, rest)`: `rest` is what a call may change (the random streams)."""
  return nnx.split(block, nnx.Param, ...)


def _stack(trees) -> object:
  return jax.tree.map(lambda *leaves: jnp.stack(leaves), *trees)


def _unstack(tree, n: int) -> list:
  return [jax.tree.map(lambda leaf, i=i: leaf[i], tree) for i in range(n)]


def _one_graphdef(graphdefs) -> nnx.GraphDef:
  if any(graphdef != graphdefs[0] for graphdef in graphdefs[1:]):
    raise ValueError("model.scan_layers needs every block built alike; these differ in "
                     "structure")
  return graphdefs[0]


def scan_layers(blocks: list[nnx.Module], n_layers: int, call: BlockCall, h_btd: jax.Array,
                mem_lbmd: jax.Array, mem_valid: jax.Array):
  """Runs layer i as `call(blocks[i % len(blocks)], h, mem_lbmd[i], mem_valid)` for i in
  `range(n_layers)`, in order, under one scan.

  Returns `(h_btd, inputs_lbtd, layer_aux)`: the last layer's output, every layer's input
  stacked, and each layer's aux dict (a list of `n_layers`), as the unrolled loop gives them.
  """
  graphdefs, params, rests = zip(*(_split(block) for block in blocks))
  graphdef = _one_graphdef(graphdefs)
  if len(blocks) == n_layers:
    return _scan_distinct(graphdef, blocks, params, rests, call, h_btd, mem_lbmd, mem_valid)
  return _scan_repeats(graphdef, blocks, params, rests, n_layers, call, h_btd, mem_lbmd,
                       mem_valid)


def _scan_distinct(graphdef, blocks, params, rests, call, h_btd, mem_lbmd, mem_valid):
  """One block per layer: the blocks' states are the scan's inputs, their streams its outputs."""

  def body(h_btd, xs):
    params_i, rest_i, mem_bmd = xs
    block = nnx.merge(graphdef, params_i, rest_i)
    out_btd, aux = call(block, h_btd, mem_bmd, mem_valid)
    return out_btd, (h_btd, aux, _split(block)[2])

  h_btd, (inputs_lbtd, aux_l, rests_l) = jax.lax.scan(
      body, h_btd, (_stack(params), _stack(rests), mem_lbmd))
  for block, rest in zip(blocks, _unstack(rests_l, len(blocks))):
    nnx.update(block, rest)
  return h_btd, inputs_lbtd, _unstack(aux_l, len(blocks))


def _scan_repeats(graphdef, blocks, params, rests, n_layers, call, h_btd, mem_lbmd,
                  mem_valid):
  """G shared blocks repeated R = n_layers / G times: the scan runs the G blocks once per
  repeat, their states carried (the parameters unchanged, the streams advanced). The
  parameters are carried rather than closed over so that each layer's Variables belong to
  the scan's trace, which `nnx.remat` inside `call` requires."""
  n_groups = len(blocks)
  n_repeats = n_layers // n_groups

  def body(carry, mem_gbmd):
    h_btd, params, rests = carry
    inputs, auxes, new_rests = [], [], []
    for g in range(n_groups):
      block = nnx.merge(graphdef, params[g], rests[g])
      inputs.append(h_btd)
      h_btd, aux = call(block, h_btd, mem_gbmd[g], mem_valid)
      auxes.append(aux)
      new_rests.append(_split(block)[2])
    return (h_btd, params, tuple(new_rests)), (jnp.stack(inputs), tuple(auxes))

  mem_rgbmd = mem_lbmd.reshape(n_repeats, n_groups, *mem_lbmd.shape[1:])
  (h_btd, _, rests), (inputs_rgbtd, aux_rg) = jax.lax.scan(body, (h_btd, params, rests),
                                                           mem_rgbmd)
  for block, rest in zip(blocks, rests):
    nnx.update(block, rest)
  inputs_lbtd = inputs_rgbtd.reshape(n_layers, *inputs_rgbtd.shape[2:])
  aux_gr = [_unstack(aux_r, n_repeats) for aux_r in aux_rg]
  layer_aux = [aux_gr[i % n_groups][i // n_groups] for i in range(n_layers)]
  return h_btd, inputs_lbtd, layer_aux
