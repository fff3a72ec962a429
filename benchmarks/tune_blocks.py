"""Block-size sweep of the Pallas kernels on a GPU: cvmm (Triton and Mosaic GPU) and the fused
Transformer-XL attention (Triton).

    python -m benchmarks.tune_blocks --out DIR [--budget_s 120] [--kernels cvmm,xl_attention]
        [--tokens 32768 --d_model 1024 --experts 128]
    python -m benchmarks.tune_blocks --kernels xl_attention --deviceless h100 --out benchmarks

cvmm: times each kernel alone (forward, input gradient, weight gradient) for the sigma-MoE
up projection (K = d_model, N = G) and down projection (K = G, N = d_model), bf16, uniform
random top-K routing. XL attention (`pallas_kernels.xl_attention`, at the WT-103 S layer:
batch 64, 10 heads of 41 padded to 48 as the XL layer passes them, segment and memory 256,
bf16): the forward kernel's tiles on the forward pass, and each backward kernel's (dk/dv,
dq) on forward + backward, the other kernels at their default tiles. Each over a small grid of
tile shapes; reports per kernel and shape the default tiles' time, the best tiles and their
time. Tiles that do not fit (shared memory, registers) fail to compile and are recorded as
errors. The defaults live beside each kernel (`matmul_blocks`, `weight_grad_blocks`,
`xl_blocks`); this script only measures.
`--deviceless TARGET` (the compile extra, XL attention only) times nothing: it compiles each
XL candidate for TARGET on this machine and records what ptxas reports of its kernel
(registers, spilled bytes, occupancy, shared memory) and its matmul instructions (Hopper's
wgmma or Ampere's mma.sync: Triton emits wgmma only for tiles a warpgroup can take), into
`tune_blocks_deviceless_<target>.json`; the XL candidates below are the tiles that do not
spill on an H100.
`--budget_s` shares its seconds equally between the (kernel, projection) sweeps: a sweep
stops starting tiles once its share has passed (the rest read "skipped: time budget"), and
the JSON is rewritten after every sweep, so a run that is killed keeps what it measured.
`--smoke` runs tiny shapes on CPU (Triton in interpret mode; Mosaic GPU cannot run there).
"""

import argparse
import itertools
import json
import math
import os
import sys
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from benchmarks import cvmm as cvmm_benchmark
from pallas_kernels import mosaic_matmul, mosaic_weight_grad, slot_layout, triton_matmul
from pallas_kernels import triton_weight_grad
from pallas_kernels.xl_attention import XLBlocks, XLTiles, xl_attention, xl_blocks
from sparse_jax.aot import kernel_resources, targets

_TRITON_MATMUL = [triton_matmul.MatmulBlocks(rows, cols, inner, num_warps=4, num_stages=stages)
                  for rows, cols, inner, stages in itertools.product(
                      (64, 128), (64, 128), (32, 64), (3, 4))]
_TRITON_WEIGHT_GRAD = [triton_weight_grad.WeightGradBlocks(rows_m, cols, inner)
                       for rows_m, cols, inner in itertools.product((64, 128), (64, 128), (32, 64))]
_MOSAIC_MATMUL = [mosaic_matmul.MatmulBlocks(rows, cols, 64, stages)
                  for rows, cols, stages in itertools.product((64, 128), (64, 128, 256),
                                                              (2, 3, 4, 5))]
_MOSAIC_WEIGHT_GRAD = [mosaic_weight_grad.WeightGradBlocks(rows_m, cols, inner, stages)
                       for rows_m, cols, inner, stages in itertools.product(
                           (64, 128), (64, 128), (64, 128), (2, 3, 4))]
# XL attention, per kernel: (q, k, warps, stages), the head's register width from the problem.
# None spills on an H100 at the WT-103 S layer (`--deviceless h100`,
# benchmarks/tune_blocks_deviceless_h100.json); beside the defaults, tiles of 64 or 128 rows
# in the kernel's matmuls, which Triton compiles to wgmma where 32 rows give mma.sync (the
# backward kernels' default: the dq kernel's rows are queries, the dk/dv kernel's keys).
_XL_CANDIDATES = {  # Each list in the order a budget cut should spare: wgmma tiles first.
    "forward": [(64, 32, 8, 2), (64, 32, 4, 2), (128, 32, 8, 2), (128, 32, 4, 2), (64, 64, 8, 3),
                (64, 32, 8, 3), (64, 64, 4, 2), (128, 64, 8, 2), (32, 64, 8, 2), (32, 32, 4, 2)],
    "dkdv": [(64, 64, 8, 2), (64, 64, 4, 2), (64, 32, 8, 2), (128, 64, 8, 2), (64, 64, 8, 3),
             (32, 64, 8, 2), (128, 32, 8, 2), (32, 32, 8, 2), (32, 128, 8, 2)],
    "dq": [(64, 32, 4, 2), (64, 32, 8, 2), (128, 32, 8, 2), (64, 64, 8, 2), (64, 32, 4, 3),
           (64, 32, 8, 3), (128, 32, 8, 3), (32, 32, 8, 2), (32, 64, 8, 2)],
}
# The WT-103 S layer (batch, segment, memory, heads, head width padded to 16-byte rows), and
# a toy one for --smoke.
_XL_SHAPE, _XL_SMOKE_SHAPE = (64, 256, 256, 10, 48), (2, 16, 8, 2, 8)
KERNELS = ("cvmm", "xl_attention")


def _parse(argv):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--out", required=True, help="directory for tune_blocks.json")
  parser.add_argument("--tokens", type=int, default=32768)
  parser.add_argument("--d_model", type=int, default=1024)
  parser.add_argument("--group", type=int, default=128, help="expert size G")
  parser.add_argument("--k", type=int, default=4)
  parser.add_argument("--experts", type=int, default=128)
  parser.add_argument("--repeats", type=int, default=10)
  parser.add_argument("--budget_s", type=float, default=None,
                      help="seconds for the whole sweep (default: no limit)")
  parser.add_argument("--kernels", default=",".join(KERNELS),
                      help=f"comma-separated, of {', '.join(KERNELS)}")
  parser.add_argument("--smoke", action="store_true", help="tiny shapes, CPU, 2 tiles each")
  parser.add_argument("--deviceless", default=None, metavar="TARGET",
                      help="compile the XL candidates for TARGET (h100, a100) and record their "
                           "ptxas reports instead of timing")
  args = parser.parse_args(argv)
  args.kernels = args.kernels.split(",")
  unknown = sorted(set(args.kernels) - set(KERNELS))
  if unknown:
    parser.error(f"--kernels: unknown {unknown}; choose from {', '.join(KERNELS)}")
  if args.deviceless and args.kernels != ["xl_attention"]:
    parser.error("--deviceless reports the XL attention's tiles only: add --kernels xl_attention")
  return args


def _problem(tokens, k, experts, size_k, size_n, seed=0):
  """Rows sorted by expert (x [S, K], dy [S, N]), the weights w [E, K, N] and the groups,
  routed as `benchmarks/cvmm.py` routes (uniform random top-k)."""
  rng = np.random.default_rng(seed)
  sel_nk, _ = cvmm_benchmark.random_routing(jax.random.key(seed), tokens, experts, k,
                                            jnp.bfloat16)
  groups = jax.jit(slot_layout.sorted_layout, static_argnums=1)(
      sel_nk.reshape(-1), experts).groups
  as_bf16 = lambda *shape: jnp.asarray(rng.standard_normal(shape), jnp.bfloat16)
  num_rows = tokens * k
  return dict(x=as_bf16(num_rows, size_k), dy=as_bf16(num_rows, size_n),
              w_ekn=as_bf16(experts, size_k, size_n), groups=groups)


def _kernel_calls(problem, interpret: bool) -> dict:
  """name -> (candidate tiles, fn(blocks) -> a jitted call with its arguments)."""
  p = problem
  return {
      "triton_forward": (_TRITON_MATMUL, lambda b: triton_matmul.segment_matmul(
          p["x"], p["w_ekn"], p["groups"], out_dtype=jnp.bfloat16, interpret=interpret,
          blocks=b)),
      "triton_weight_grad": (_TRITON_WEIGHT_GRAD, lambda b: triton_weight_grad.weight_grad(
          p["x"], p["dy"], p["groups"], out_dtype=jnp.bfloat16, interpret=interpret, blocks=b)),
      "mosaic_forward": (_MOSAIC_MATMUL, lambda b: mosaic_matmul.segment_matmul(
          p["x"], p["w_ekn"], p["groups"], transpose_w=False, out_dtype=jnp.bfloat16,
          blocks=b)),
      "mosaic_input_grad": (_MOSAIC_MATMUL, lambda b: mosaic_matmul.segment_matmul(
          p["dy"], p["w_ekn"], p["groups"], transpose_w=True, out_dtype=jnp.float32,
          blocks=b)),
      "mosaic_weight_grad": (_MOSAIC_WEIGHT_GRAD, lambda b: mosaic_weight_grad.weight_grad(
          p["x"], p["dy"], p["groups"], out_dtype=jnp.bfloat16, blocks=b)),
  }


def _xl_problem(batch, seq_len, mem_len, heads, head_dim, seed=0) -> tuple:
  """The XL attention's inputs (q_u, q_v, k, v, r, scale, mem_valid), bf16, memory all
  valid."""
  rng = np.random.default_rng(seed)
  as_bf16 = lambda *shape: jnp.asarray(rng.standard_normal(shape), jnp.bfloat16)
  keys = mem_len + seq_len
  return (as_bf16(batch, seq_len, heads, head_dim), as_bf16(batch, seq_len, heads, head_dim),
          as_bf16(batch, keys, heads, head_dim), as_bf16(batch, keys, heads, head_dim),
          as_bf16(keys, heads, head_dim), jnp.float32(head_dim ** -0.5), jnp.int32(mem_len))


def _xl_passes(interpret: bool | None) -> dict:
  """kernel -> the jitted pass that runs it, `pass_(tiles, *inputs)`: the forward pass for the
  forward kernel, forward + backward for the backward kernels (interpret: as `xl_attention`)."""
  attend = lambda tiles, *a: xl_attention(*a, interpret=interpret, tiles=tiles)
  gradient = jax.grad(lambda tiles, *a: jnp.sum(attend(tiles, *a).astype(jnp.float32)),
                      argnums=(1, 2, 3, 4, 5))
  backward = jax.jit(gradient, static_argnums=0)
  return {"forward": jax.jit(attend, static_argnums=0), "dkdv": backward, "dq": backward}


def _xl_sizes(inputs) -> tuple:
  """(T, K, head width, dtype) of the XL inputs (arrays or shapes), as `xl_blocks` and
  `XLTiles.of` take them."""
  q_u, _, k = inputs[:3]
  return q_u.shape[1], k.shape[1], q_u.shape[-1], q_u.dtype


def _xl_tiles(kernel: str, candidate, inputs) -> XLTiles:
  """`kernel`'s candidate (q, k, warps, stages) as tiles for `inputs` (the head's register
  width from `xl_blocks`), the others at their defaults."""
  if candidate is None:
    return XLTiles()
  q, k, warps, stages = candidate
  width = xl_blocks(*_xl_sizes(inputs)).d
  return XLTiles(**{kernel: XLBlocks(q, k, width, num_warps=warps, num_stages=stages)})


def _xl_calls(args: tuple, interpret: bool) -> dict:
  """name -> (candidate tiles, fn(candidate) -> its kernel's pass with those tiles)."""
  return {f"xl_attention_{kernel}": (
      _XL_CANDIDATES[kernel],
      lambda c, kernel=kernel, pass_=pass_: pass_(_xl_tiles(kernel, c, args), *args))
          for kernel, pass_ in _xl_passes(interpret or None).items()}


def _xl_deviceless(target_name: str, out_dir: str) -> list[dict]:
  """Each XL kernel's default and candidate tiles compiled for `target_name` at the WT-103 S
  layer: the kernel's ptxas report and matmul instructions, one row each; written to
  `out_dir/tune_blocks_deviceless_<target>.json`."""
  target = targets.parse_target(target_name)
  mesh = targets.one_device_mesh(target)
  sharding = NamedSharding(mesh, PartitionSpec())
  inputs = [jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding)
            for x in _xl_problem(*_XL_SHAPE)]
  rows = []
  for kernel, pass_ in _xl_passes(None).items():
    for candidate in [None, *_XL_CANDIDATES[kernel]]:
      tiles = _xl_tiles(kernel, candidate, inputs)
      with tempfile.TemporaryDirectory() as dump, jax.set_mesh(mesh):
        pass_.trace(tiles, *inputs).lower(
            lowering_platforms=(target.lowering_platform,)).compile(
                kernel_resources.dump_options(dump))
        [found] = [r for r in kernel_resources.kernel_resources(dump, target, "xl_attention")
                   if r.name == f"xl_attention_{kernel}"]
      blocks = tiles.of(kernel, *_xl_sizes(inputs))
      rows.append({"kernel": kernel, "default": candidate is None,
                   "blocks": _describe((blocks.q, blocks.k, blocks.num_warps,
                                        blocks.num_stages)),
                   "registers": found.registers,
                   "spill_bytes": found.spill_stores + found.spill_loads,
                   "occupancy": found.occupancy, "shared_bytes": found.shared_bytes,
                   "wgmma": found.ptx["wgmma"], "mma_sync": found.ptx["mma_sync"]})
      print(f"  {rows[-1]}", file=sys.stderr)
  path = os.path.join(out_dir, f"tune_blocks_deviceless_{target_name}.json")
  with open(path, "w") as f:
    json.dump({"meta": {"target": target_name, "jax": jax.__version__,
                        "shape": dict(zip(("batch", "seq_len", "mem_len", "heads",
                                           "head_width"), _XL_SHAPE))},
               "rows": rows}, f, indent=1)
  print(_deviceless_markdown(rows))
  return rows


def _deviceless_markdown(rows) -> str:
  lines = ["| kernel | q x k, warps, stages | registers | spilled bytes | occupancy | "
           "shared KiB | wgmma / mma.sync |", "|---|---|---:|---:|---:|---:|---|"]
  for r in rows:
    b = r["blocks"]
    tiles = (f"{b['q']} x {b['k']}, {b['num_warps']}, {b['num_stages']}"
             + (" (default)" if r["default"] else ""))
    lines.append(f"| {r['kernel']} | {tiles} | {r['registers']} | {r['spill_bytes']} | "
                 f"{r['occupancy']:.3f} | {r['shared_bytes'] / 1024:.1f} | "
                 f"{r['wgmma']} / {r['mma_sync']} |")
  return "\n".join(lines)


def _sweeps(args) -> list[tuple]:
  """(kernel, shape name, candidates, run) of every sweep `--kernels` names."""
  sweeps = []
  if "cvmm" in args.kernels:
    for projection, (size_k, size_n) in {"up": (args.d_model, args.group),
                                         "down": (args.group, args.d_model)}.items():
      problem = _problem(args.tokens, args.k, args.experts, size_k, size_n)
      for name, (candidates, run) in _kernel_calls(problem, interpret=args.smoke).items():
        sweeps.append((name, projection, candidates, run))
  if "xl_attention" in args.kernels:
    shape = _XL_SMOKE_SHAPE if args.smoke else _XL_SHAPE
    for name, (candidates, run) in _xl_calls(_xl_problem(*shape), args.smoke).items():
      sweeps.append((name, "wt103_s", candidates, run))
  return sweeps


def _sweep(candidates, run, repeats: int, deadline: float) -> list[dict]:
  """One row per candidate (None = the kernel's default tiles): ms, or the error; candidates
  not started by `deadline` (time.monotonic()) are recorded as skipped."""
  rows = []
  for blocks in [None, *candidates]:
    row = {"blocks": "default" if blocks is None else _describe(blocks)}
    if time.monotonic() > deadline:
      row["error"] = "skipped: time budget"
      rows.append(row)
      continue
    try:
      row["ms"] = cvmm_benchmark.time_interleaved_ms({"tiles": (run, (blocks,))},
                                                     repeats)["tiles"]
    except Exception as error:  # A tile shape that does not fit is a result, not a crash.
      row["error"] = f"{type(error).__name__}: {str(error).splitlines()[0][:200]}"
    rows.append(row)
    print(f"  {row}", file=sys.stderr)
  return rows


def _describe(blocks):
  """A candidate as JSON: a blocks dataclass's fields, or an XL (q, k, warps, stages)."""
  if isinstance(blocks, tuple):
    return dict(zip(("q", "k", "num_warps", "num_stages"), blocks))
  return vars(blocks)


def _summary(name, projection, rows) -> dict:
  timed = [r for r in rows if "ms" in r]
  best = min(timed, key=lambda r: r["ms"]) if timed else None
  default = rows[0]
  return {"kernel": name, "projection": projection, "default_ms": default.get("ms"),
          "default_error": default.get("error"), "best_ms": best and best["ms"],
          "best_blocks": best and best["blocks"], "tried": len(rows),
          "failed": len(rows) - len(timed)}


def _markdown(summaries) -> str:
  lines = ["| kernel | projection | default ms | best ms | best tiles | failed / tried |",
           "|---|---|---:|---:|---|---:|"]
  fmt = lambda v: "n/a" if v is None else f"{v:.3f}"
  for s in summaries:
    lines.append(f"| {s['kernel']} | {s['projection']} | {fmt(s['default_ms'])} | "
                 f"{fmt(s['best_ms'])} | {s['best_blocks']} | {s['failed']} / {s['tried']} |")
  return "\n".join(lines)


def main(argv=None) -> list[dict]:
  args = _parse(argv)
  if args.deviceless:
    os.makedirs(args.out, exist_ok=True)
    return _xl_deviceless(args.deviceless, args.out)
  if args.smoke:
    args.tokens, args.d_model, args.group, args.k, args.experts, args.repeats = 48, 64, 64, 2, 4, 1
  elif jax.default_backend() != "gpu":
    sys.exit("no GPU found: run with --smoke to check the sweep on CPU")
  os.makedirs(args.out, exist_ok=True)
  meta = {"device": jax.devices()[0].device_kind, "jax": jax.__version__,
          "argv": argv or sys.argv[1:], "budget_s": args.budget_s, "kernels": args.kernels,
          "shapes": {k: getattr(args, k) for k in ("tokens", "d_model", "group", "k", "experts")}}
  start, sweeps = time.monotonic(), _sweeps(args)
  summaries, details = [], {}
  for name, shape, candidates, run in sweeps:
    print(f"tune_blocks: {name} {shape}", file=sys.stderr)
    share = (len(summaries) + 1) / len(sweeps)
    deadline = math.inf if args.budget_s is None else start + share * args.budget_s
    rows = _sweep(candidates[:2] if args.smoke else candidates, run, args.repeats, deadline)
    details[f"{name}/{shape}"] = rows
    summaries.append(_summary(name, shape, rows))
    with open(os.path.join(args.out, "tune_blocks.json"), "w") as f:
      json.dump({"meta": meta, "summary": summaries, "details": details}, f, indent=1)
  print(_markdown(summaries))
  return summaries


if __name__ == "__main__":
  main()
