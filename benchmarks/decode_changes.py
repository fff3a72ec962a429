"""What each change to the decoding path buys, measured side by side in one process.

    python -m benchmarks.decode_changes [--calls=60] [--out=benchmarks/decode_changes_cpu.json]

At the 17B shape of `benchmarks/decode.py` (its sparse FF + QKV variant; `--d_model` etc.
shrink it), each change is compiled twice, `without` it (the code it replaced patched back in
while that step is traced) and `with` it, and the two steps are called in turns (ABBA, the
cache donated and fed back) so that the machine's drift hits both alike; their outputs must be
equal bit for bit. Prints the median ms of each and writes JSON.

- `cache_in_place`: the K/V row write ordered after the attention's reads
  (`causal_attention.index_after`; without it XLA:CPU copies each cache twice per token), on
  the attention half; also counts the cache copies in each compiled program.
- `first_max_index`: SparseFF's unit choice as max, then the least index attaining it
  (`sparse_ff.first_max_index`; without: `jnp.argmax`), on the whole block.
- `mult_d_layout`, a candidate not in the library: the multiplicative layer's D stored
  `[S, d_in]` (Trax's layout; ours is `[d_in, S]`), which spares transposing `x * D` on every
  token, on the attention half.
"""

import argparse
import contextlib
import functools
import statistics
from unittest import mock

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from benchmarks import decode
from benchmarks.lm_train_step import abba_step_times
from benchmarks.machine import machine_info, write_result
from sparse_jax.layers import causal_attention, sparse_ff
from sparse_jax.layers.multiplicative_dense import MultiplicativeDense
from sparse_jax.models.blocks import DecoderBlock
from sparse_jax.models.lm_config import validate_model_config


def _mult_with_d_transposed(self, x):
  """`MultiplicativeDense.__call__` for a `d_is` parameter holding D^T, `[S, d_in]`."""
  dtype = x.dtype
  y_sm = jnp.einsum("...i,si,im->...sm", x, self.d_is[...].astype(dtype),
                    self.e_im[...].astype(dtype))
  y = y_sm.reshape(*x.shape[:-1], self.d_out)
  return y if self.bias is None else y + self.bias[...].astype(dtype)


def _transpose_d(state):
  """`state` of a module holding one `mult` layer, with its D stored transposed."""
  state = jax.tree.map(lambda leaf: leaf, state)
  state["mult"]["d_is"].set_value(state["mult"]["d_is"].get_value().T.copy())
  return state


# change: (the part it is timed on, the patch that undoes it or None, the patch that applies
# it or None, how the state changes with it)
CHANGES = {
    "cache_in_place": ("attn", mock.patch.object(causal_attention, "index_after",
                                                 lambda index, x, size: index), None, None),
    "first_max_index": ("block", mock.patch.object(
        sparse_ff, "first_max_index", lambda x: jnp.argmax(x, -1).astype(jnp.int32)), None,
                        None),
    "mult_d_layout": ("attn", None, mock.patch.object(MultiplicativeDense, "__call__",
                                                      _mult_with_d_transposed), _transpose_d),
}


class CompiledDecode:
  """One module's decode step, compiled under `patch`, with its own donated cache."""

  def __init__(self, module, init_cache, position, h_b1d, patch=None, state_fn=None):
    graphdef, state = nnx.split(module)
    self.state = state_fn(state) if state_fn else state
    self.cache, self.h_b1d = init_cache(), h_b1d
    step = jax.jit(lambda state, cache, h: nnx.merge(graphdef, state).decode(h, cache, position),
                   donate_argnums=1)
    with patch or contextlib.nullcontext():
      self.compiled = step.lower(self.state, self.cache, h_b1d).compile()

  def cache_copies(self) -> int:
    """Copies of a K/V-cache-shaped array in the compiled program."""
    shape = "f32[" + ",".join(map(str, self.cache["k"].shape)) + "]"
    entry = self.compiled.as_text().split("ENTRY", 1)[1]
    return sum(shape in line and " copy(" in line for line in entry.splitlines())

  def __call__(self):
    y, self.cache = jax.block_until_ready(self.compiled(self.state, self.cache, self.h_b1d))
    return y


def interleaved_ms(steps: dict, calls: int) -> dict[str, float]:
  """Median ms of each no-argument step over `calls` calls taken in turns
  (`lm_train_step.abba_step_times`, after one call each)."""
  times = abba_step_times({name: lambda batch, i, step=step: step() for name, step in
                           steps.items()}, [None], calls)
  return {name: 1000 * statistics.median(t) for name, t in times.items()}


def measure(change: str, block: DecoderBlock, context: int, calls: int) -> dict:
  part, undo, apply, state_fn = CHANGES[change]
  module = block.attn if part == "attn" else block
  h = jax.random.normal(jax.random.key(0), (1, 1, block.attn.d_model))
  make = functools.partial(CompiledDecode, module,
                           lambda: block.attn.init_cache(1, context + 1, jnp.float32),
                           jnp.int32(context), h)
  steps = {"without": make(undo), "with": make(apply, state_fn)}
  same = np.array_equal(np.asarray(steps["without"]()), np.asarray(steps["with"]()))
  ms = interleaved_ms(steps, calls)
  return {"change": change, "part": part, "without_ms": ms["without"], "with_ms": ms["with"],
          "saved_ms": ms["without"] - ms["with"], "same_output": same,
          "cache_copies": {name: step.cache_copies() for name, step in steps.items()}}


def main(argv=None) -> dict:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  for name in decode.SHAPES["17b"]:
    parser.add_argument(f"--{name}", type=int, default=None, help="Overrides the 17b shape's.")
  parser.add_argument("--context", type=int, default=128, help="Cached positions.")
  parser.add_argument("--calls", type=int, default=60, help="Timed calls of each step.")
  parser.add_argument("--changes", default=",".join(CHANGES))
  parser.add_argument("--out", default="benchmarks/decode_changes_cpu.json")
  args = parser.parse_args(argv)
  changes = args.changes.split(",")
  if not set(changes) <= set(CHANGES):
    raise SystemExit(f"--changes must be a comma-separated subset of {list(CHANGES)}; "
                     f"got {args.changes!r}")
  shape = decode.shape_of(argparse.Namespace(shape="17b", **{
      k: getattr(args, k) for k in decode.SHAPES["17b"]}))
  cfg = validate_model_config(decode.model_config("sparse_ff_qkv", shape, 1))
  block = DecoderBlock(cfg, rngs=nnx.Rngs(0))
  block.eval()
  rows = [measure(change, block, args.context, args.calls) for change in changes]
  print("| change | timed on | without ms | with ms | saved ms | same output | cache copies |")
  print("|---|---|---:|---:|---:|---|---|")
  for r in rows:
    copies = r["cache_copies"]
    print(f"| {r['change']} | {r['part']} | {r['without_ms']:.3f} | {r['with_ms']:.3f} "
          f"| {r['saved_ms']:.3f} | {r['same_output']} | {copies['without']} -> "
          f"{copies['with']} |")
  result = {"machine": machine_info(), **vars(args), "shape_fields": shape, "rows": rows}
  write_result(result, args.out)
  return result


if __name__ == "__main__":
  main()
