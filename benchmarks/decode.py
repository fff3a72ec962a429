"""Unbatched decoding speed: dense vs Scaling Transformers' sparse layers (paper Table 1).

    python -m benchmarks.decode [--shape=800m] [--layers=4] [--out=benchmarks/decode_cpu.json]
    python -m benchmarks.decode --shape=17b --block_only --out=benchmarks/decode_17b_cpu.json
    python -m benchmarks.decode --shape=17b --profile ...   # + each block's slowest XLA ops
    python -m benchmarks.decode --shape=17b --tensor=8 --variants=dense,sparse_ff_qkv \
        --out=benchmarks/decode_17b_tensor8_cpu.json         # split over 8 simulated devices

Times one decoded token (batch 1, a KV cache of `--context` positions, donated and updated in
place as a decoding loop does, float32, random weights)
for one decoder block and, unless `--block_only`, for a small whole model, for four variants:
the dense block (causal attention, dense FF), SparseFF, sparse QKV (with `d_ff` raised by
`2 d_model`, the parameters the sparse QKV layer frees: the paper's 4096 -> 6144) and both.
Prints a table with ratios to dense, next to the paper's per-block times, and writes JSON.

Shapes (`--shape`, each field overridable by its flag):
- `800m`: the paper's T5-large-like model: d_model 1024, 16 heads, S = 16, d_ff 4096,
  FF sparsity (block) 64. Paper per block: dense 5.9 ms, FF+QKV 1.9 ms (3.05x).
- `17b`: the paper's 17B model: d_model 9216, 96 heads, attention sparsity S = 64 (a head
  spans 1.5 modules), FF sparsity 256. The paper does not print its d_ff; 49152 is the width
  that gives "approximately 17B" parameters for 6 + 6 encoder-decoder layers
  (`72 d^2 + 24 d d_ff` = 17.0B). One block is about 5 GB of float32 weights, so only the
  block is timed (`--block_only` is implied). Paper per block: dense 581 ms, FF+QKV 14 ms
  (42.5x).
Inputs are sinusoidal-position models as Trax's (`model.positions`), so attention has no
rotary rotation.

With `--tensor=t` (t simulated CPU devices; issue 74) the blocks are created split over a
`tensor` mesh of t devices (heads, FF hidden units, the sparse layers' modules and blocks) and
timed there (the devices share the machine's cores: this checks the program, not a speed-up),
and a second table gives, per decoded token and block, the collectives of the compiled step
(`sparse_jax.aot.collectives`: count and bytes of each kind) and whether a one-layer LM of the
variant decodes the same greedy tokens split as on one device (`sparse_jax.generate`).
"""

import argparse
import contextlib
import functools
import gc
import json
import os
import platform
import resource
import statistics
import time

import jax

if __name__ == "__main__":  # before any JAX operation creates the CPU backend
  jax.config.update("jax_num_cpu_devices", 8)

import jax.numpy as jnp
import ml_collections
from flax import nnx

import sparse_jax
from benchmarks import op_profile, roofline
from sparse_jax import parallel
from sparse_jax.aot.collectives import collectives
from sparse_jax.layers.sparse_ff import SparseFF
from sparse_jax.models.blocks import DecoderBlock
from sparse_jax.models.lm import TransformerLM
from sparse_jax.models.lm_config import validate_model_config
from sparse_jax.models.tensor_support import check_tensor_parallel
from sparse_jax.training.placement import Placement

SHAPES = {
    "800m": dict(d_model=1024, n_heads=16, attention_sparsity=None, d_ff=4096, block_size=64),
    "17b": dict(d_model=9216, n_heads=96, attention_sparsity=64, d_ff=49152, block_size=256),
}
# name: (attention, FF kind, whether d_ff is raised for the sparse QKV layer's parameters)
VARIANTS = {
    "dense": ("causal", "dense", False),
    "sparse_ff": ("causal", "sparse_ff", False),
    "sparse_qkv": ("sparse_qkv", "dense", True),
    "sparse_ff_qkv": ("sparse_qkv", "sparse_ff", True),
}
PAPER_BLOCK_MS = {  # Table 1, decoding time per block.
    "800m": {"dense": 5.9, "sparse_ff": 3.1, "sparse_qkv": 6.2, "sparse_ff_qkv": 1.9},
    "17b": {"dense": 581.0, "sparse_ff": 259.0, "sparse_qkv": 554.0, "sparse_ff_qkv": 14.0},
}


def shape_of(args: argparse.Namespace) -> dict:
  """The `--shape` preset with the fields given on the command line replacing its own."""
  shape = dict(SHAPES[args.shape])
  shape.update({k: getattr(args, k) for k in shape if getattr(args, k) is not None})
  return shape


def qkv_d_ff(d_ff: int, d_model: int, block_size: int) -> int:
  """`d_ff + 2 d_model` (dense Q, K, V, O hold `4 d_model^2` parameters, an FF unit
  `2 d_model`), rounded up to a multiple of the FF block: 4096 -> 6144 at d_model 1024."""
  raised = d_ff + 2 * d_model
  return -(-raised // block_size) * block_size


def model_config(variant: str, shape: dict, n_layers: int,
                 d_lowrank: int | None = None) -> ml_collections.ConfigDict:
  """The `model` section of `variant` at `shape` (random weights, vocabulary 256)."""
  attention, ff_kind, raise_d_ff = VARIANTS[variant]
  d_ff = (qkv_d_ff(shape["d_ff"], shape["d_model"], shape["block_size"]) if raise_d_ff
          else shape["d_ff"])
  ff = {"kind": ff_kind, "d_ff": d_ff}
  if ff_kind == "sparse_ff":
    ff.update(block_size=shape["block_size"], d_lowrank=d_lowrank)
  cfg = dict(vocab_size=256, d_model=shape["d_model"], n_layers=n_layers,
             n_heads=shape["n_heads"], mem_len=0, dropout=0.0, attention=attention,
             positions="sinusoidal", ff=ff)
  if attention == "sparse_qkv" and shape["attention_sparsity"] is not None:
    cfg["attention_sparsity"] = shape["attention_sparsity"]
  return ml_collections.ConfigDict(cfg)


def median_seconds(step, state, cache, x, repeats: int, reset=lambda cache: cache) -> float:
  """Median seconds of `step(state, cache, x) -> (y, cache)` with the cache donated and fed
  back, as a decoding loop runs it (so the cache is updated in place, not copied);
  `reset(cache)` before each call keeps the position fixed. The first call compiles."""
  times = []
  for call in range(repeats + 1):
    cache = reset(cache)
    start = time.perf_counter()
    cache = jax.block_until_ready(step(state, cache, x))[1]
    if call:
      times.append(time.perf_counter() - start)
  return statistics.median(times)


def bytes_read(block: nnx.Module, cache) -> int:
  """Bytes one decoded token must read: every weight of `block` once, except that a SparseFF
  reads only the chosen unit of each block of W1, b1 and W2 (1 / block_size of them), and
  the whole KV cache (attention reads every slot)."""
  weights = sum(leaf.nbytes for leaf in jax.tree.leaves(nnx.state(block, nnx.Param)))
  for _, module in nnx.iter_graph(block):
    if isinstance(module, SparseFF):
      chosen = [p[...].nbytes for p in (module.w_keys, module.w_values, module.b_up)
                if p is not None]
      weights -= sum(chosen) * (1 - 1 / module.block_size)
  return int(weights) + sum(leaf.nbytes for leaf in jax.tree.leaves(cache))


def xla_flops(compiled) -> float:
  """XLA's FLOP count of a compiled call (a dict, or a list of one on older JAX)."""
  analysis = compiled.cost_analysis()
  analysis = analysis[0] if isinstance(analysis, (list, tuple)) else analysis
  return float(analysis.get("flops", 0.0))


def profile_ops(step, state, cache, x, calls: int, top: int = 12) -> list[dict]:
  """The `top` slowest XLA operations of `step` (already compiled), in ms per call over
  `calls` profiled calls (`op_profile.per_op_ms`), with the cache fed back as in
  `median_seconds`."""
  def run():
    nonlocal cache
    cache = jax.block_until_ready(step(state, cache, x))[1]

  return [{"op": op, "ms": ms} for op, ms in op_profile.per_op_ms(run, calls)[:top]]


def collective_totals(hlo: str) -> dict[str, dict[str, int]]:
  """Count and bytes of each kind of collective in a compiled program's HLO text."""
  totals = {}
  for c in collectives(hlo):
    kind = totals.setdefault(c.kind, {"n": 0, "bytes": 0})
    kind["n"] += 1
    kind["bytes"] += c.nbytes
  return totals


def _timed(module: nnx.Module, decode_fn, cache, h, repeats: int,
           profile: bool = False) -> dict:
  """`decode_fn(module, cache, h) -> (y, cache)` jitted with the cache donated: median
  seconds, the bytes it must read (`bytes_read`), XLA's FLOP count, its collectives
  (`collective_totals`; none on one device) and, with `profile`, its slowest operations
  (`profile_ops`)."""
  graphdef, state = nnx.split(module)
  nbytes = bytes_read(module, cache)

  @functools.partial(jax.jit, donate_argnums=1)
  def step(state, cache, h_b1d):
    return decode_fn(nnx.merge(graphdef, state), cache, h_b1d)

  compiled = step.lower(state, cache, h).compile()
  profile_cache = jax.tree.map(jnp.copy, cache) if profile else None  # `cache` is donated
  timed = {"seconds": median_seconds(step, state, cache, h, repeats), "bytes": nbytes,
           "flops": xla_flops(compiled), "collectives": collective_totals(compiled.as_text())}
  if profile:
    timed["ops"] = profile_ops(step, state, profile_cache, h, repeats)
  return timed


def build(module_class, cfg, mesh=None) -> nnx.Module:
  """`module_class(cfg)` (random weights, seed 0) in eval mode: on the default device, or
  created in its shardings on `mesh` (split over `tensor`), so that no device ever holds it
  whole."""
  make = lambda: module_class(validate_model_config(cfg), rngs=nnx.Rngs(0))
  module = make() if mesh is None else Placement(mesh).create(make)
  module.eval()
  return module


def time_block(cfg, context: int, repeats: int, profile: bool = False,
               mesh=None) -> dict[str, dict]:
  """One block's `decode` of a token after `context` cached ones (`_timed`, profiled with
  `profile`), and its two halves alone: the attention (with its cache) and the FF (its
  sparse decode path if any); split over `mesh` if given (run inside `jax.set_mesh`)."""
  block = build(DecoderBlock, cfg, mesh)
  position = jnp.int32(context)
  new_cache = lambda: block.attn.init_cache(1, context + 1, jnp.float32)
  h = jax.random.normal(jax.random.key(0), (1, 1, cfg.d_model))
  ff_decode = lambda ff, x: ff.decode(x) if ff.has_sparse_decode else ff(x)[0]
  return {
      "block": _timed(block, lambda m, c, x: m.decode(x, c, position), new_cache(), h, repeats,
                      profile),
      "attn": _timed(block.attn, lambda m, c, x: m.decode(x, c, position), new_cache(), h,
                     repeats),
      "ff": _timed(block.ff, lambda m, c, x: (ff_decode(m, x), c), (), h, repeats)}


def time_model(cfg, context: int, repeats: int, mesh=None) -> float:
  """Median seconds of the whole model's `decode_step` after `context` cached tokens (split
  over `mesh` if given, run inside `jax.set_mesh`)."""
  lm = build(TransformerLM, cfg, mesh)
  graphdef, state = nnx.split(lm)
  cache = lm.init_cache(1, context + 1)

  @functools.partial(jax.jit, donate_argnums=1)
  def step(state, cache, tokens_b1):
    return nnx.merge(graphdef, state).decode_step(tokens_b1, cache)

  return median_seconds(step, state, cache, jnp.zeros((1, 1), jnp.int32), repeats,
                        reset=lambda cache: {**cache, "position": jnp.int32(context)})


def same_tokens(variant: str, shape: dict, mesh, n_tokens: int = 4) -> bool:
  """Whether a one-layer LM of `variant` at `shape` (random weights) decodes the same greedy
  tokens after a 2-token prompt split over `mesh` as on one device (each model built and
  freed in turn: at the 17B shape one holds about 5 GB)."""
  cfg, prompt = model_config(variant, shape, 1), jnp.array([[1, 2]], jnp.int32)
  one = sparse_jax.generate(build(TransformerLM, cfg), prompt, n_tokens, temperature=0.0)
  gc.collect()
  with jax.set_mesh(mesh):
    split = sparse_jax.generate(build(TransformerLM, cfg, mesh), prompt, n_tokens,
                                temperature=0.0)
  gc.collect()
  return bool((one == split).all())


def peak_rss_gib() -> float:
  """This process's peak resident memory so far (Linux reports KiB)."""
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2 ** 20


def parse_args(argv=None) -> argparse.Namespace:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--shape", choices=sorted(SHAPES), default="800m",
                      help="Preset block shape; 17b implies --block_only.")
  for name in SHAPES["800m"]:
    parser.add_argument(f"--{name}", type=int, default=None, help="Overrides the shape's.")
  parser.add_argument("--d_lowrank", type=int, default=None,
                      help="SparseFF controller rank (default d_ff / block_size, Trax's).")
  parser.add_argument("--block_only", action="store_true", help="Skip the whole-model timing.")
  parser.add_argument("--layers", type=int, default=4, help="Layers of the whole model.")
  parser.add_argument("--context", type=int, default=128, help="Cached positions.")
  parser.add_argument("--repeats", type=int, default=None,
                      help="Timed calls per measurement (default 50; 10 for 17b).")
  parser.add_argument("--bandwidth_mib", type=int, default=1024,
                      help="Array size of the bandwidth measurement the bounds use.")
  parser.add_argument("--profile", action="store_true",
                      help="Also profile each block's decode: its slowest XLA operations.")
  parser.add_argument("--tensor", type=int, default=1,
                      help="Split the blocks over a tensor mesh of this many CPU devices.")
  parser.add_argument("--variants", default=",".join(VARIANTS),
                      help=f"Comma-separated subset of {list(VARIANTS)}, dense included.")
  parser.add_argument("--out", default="benchmarks/decode_cpu.json")
  args = parser.parse_args(argv)
  args.block_only = args.block_only or args.shape == "17b"
  args.repeats = args.repeats or (10 if args.shape == "17b" else 50)
  requested = args.variants.split(",")
  if "dense" not in requested or not set(requested) <= set(VARIANTS):
    parser.error(f"--variants must name dense and others of {list(VARIANTS)}; got "
                 f"{args.variants!r}.")
  args.variants = [v for v in VARIANTS if v in requested]
  if not 1 <= args.tensor <= jax.device_count():
    parser.error(f"--tensor must be in [1, {jax.device_count()}] (the CPU devices); got "
                 f"{args.tensor}.")
  return args


def measure(variant: str, args: argparse.Namespace, shape: dict, peaks: dict,
            mesh=None) -> dict:
  """One variant's row: its block's times, bounds and collectives (split over `mesh` if
  given), the whole model's time unless `--block_only`, and with `mesh` whether it decodes
  the same tokens (`same_tokens`)."""
  cfg = model_config(variant, shape, args.layers, args.d_lowrank)
  check_tensor_parallel(validate_model_config(cfg), args.tensor)
  row = {"variant": variant, "d_ff": cfg.ff.d_ff}
  with jax.set_mesh(mesh) if mesh is not None else contextlib.nullcontext():
    parts = time_block(cfg, args.context, args.repeats, args.profile, mesh)
    gc.collect()
    if not args.block_only:
      row["model_ms"] = 1000 * time_model(cfg, args.context, args.repeats, mesh)
      gc.collect()
  if mesh is not None:
    row["same_tokens"] = same_tokens(variant, shape, mesh)
  for part, timed in parts.items():
    row[f"{part}_collectives"] = timed["collectives"]
    if "ops" in timed:
      row["block_ops"] = timed["ops"]
    bytes_ms = 1000 * timed["bytes"] / (peaks["read_gb_s"] * 1e9)
    flops_ms = 1000 * timed["flops"] / (peaks["matmul_gflop_s"] * 1e9)
    prefix = "" if part == "block" else f"{part}_"
    row.update({f"{part}_ms": 1000 * timed["seconds"], f"{part}_mb_read": timed["bytes"] / 1e6,
                f"{part}_flops": timed["flops"], f"{prefix}bytes_bound_ms": bytes_ms,
                f"{prefix}flops_bound_ms": flops_ms})
    row[f"{prefix}x_bytes_bound"] = row[f"{part}_ms"] / bytes_ms
    row[f"{prefix}x_roofline"] = row[f"{part}_ms"] / max(bytes_ms, flops_ms)
  row["peak_rss_gib"] = peak_rss_gib()
  return row


def print_table(rows: list[dict], paper: dict | None) -> None:
  dense = rows[0]
  header = (f"{'variant':<14} {'d_ff':>6} {'block ms':>10} {'x dense':>8} {'MB read':>9} "
            f"{'x bytes bd':>10} {'x roofline':>10} {'attn ms':>8} {'x rf':>5} "
            f"{'FF ms':>8} {'x rf':>5}")
  header += f" {'paper x':>8}" if paper else ""
  header += "" if "model_ms" not in dense else f" {'model ms':>9} {'x dense':>8}"
  print(header)
  for r in rows:
    r["block_speedup"] = dense["block_ms"] / r["block_ms"]
    line = (f"{r['variant']:<14} {r['d_ff']:>6} {r['block_ms']:>10.3f} "
            f"{r['block_speedup']:>8.2f} {r['block_mb_read']:>9.1f} "
            f"{r['x_bytes_bound']:>10.2f} {r['x_roofline']:>10.2f} "
            f"{r['attn_ms']:>8.3f} {r['attn_x_roofline']:>5.2f} "
            f"{r['ff_ms']:>8.3f} {r['ff_x_roofline']:>5.2f}")
    if paper:
      line += f" {paper['dense'] / paper[r['variant']]:>8.2f}"
    if "model_ms" in r:
      r["model_speedup"] = dense["model_ms"] / r["model_ms"]
      line += f" {r['model_ms']:>9.3f} {r['model_speedup']:>8.2f}"
    print(line)


def print_collectives(rows: list[dict], tensor: int) -> None:
  """Per decoded token and block: count / KiB of each kind of collective (AR all-reduce, AG
  all-gather, CP collective-permute), the total, and whether the LM decodes the same tokens
  split as on one device."""
  kinds = {"all-reduce": "AR", "all-gather": "AG", "collective-permute": "CP"}
  print(f"per token and block on tensor={tensor}: count / KiB of the arrays")
  print(f"{'variant':<14} " + " ".join(f"{k:>10}" for k in kinds.values())
        + f" {'total KiB':>10} {'same tokens':>12}")
  for r in rows:
    found = r["block_collectives"]
    cells = [f"{found[k]['n']} / {found[k]['bytes'] / 1024:.1f}" if k in found else "-"
             for k in kinds]
    total = sum(c["bytes"] for c in found.values()) / 1024
    print(f"{r['variant']:<14} " + " ".join(f"{c:>10}" for c in cells)
          + f" {total:>10.1f} {str(r['same_tokens']):>12}")


def print_profiles(rows: list[dict]) -> None:
  """Each profiled block's slowest operations, ms per call (names as in the compiled HLO)."""
  for r in rows:
    if "block_ops" in r:
      print(f"{r['variant']} block ({r['block_ms']:.3f} ms): " + ", ".join(
          f"{o['op']} {o['ms']:.3f}" for o in r["block_ops"]))


def main(argv=None) -> dict:
  args = parse_args(argv)
  shape = shape_of(args)
  peaks = roofline.measured_peaks(mib=args.bandwidth_mib)
  print(f"measured: read {peaks['read_gb_s']:.1f} GB/s, copy {peaks['copy_gb_s']:.1f} GB/s, "
        f"f32 matmul {peaks['matmul_gflop_s']:.1f} GFLOP/s")
  mesh = parallel.make_mesh((1, 1, 1, args.tensor)) if args.tensor > 1 else None
  rows = [measure(name, args, shape, peaks, mesh) for name in args.variants]
  paper = PAPER_BLOCK_MS[args.shape] if shape == SHAPES[args.shape] else None
  print_table(rows, paper)
  if mesh is not None:
    print_collectives(rows, args.tensor)
  print_profiles(rows)
  result = {"machine": f"{platform.machine()}, {os.cpu_count()} cores, "
                       f"{jax.default_backend()}", "jax": jax.__version__, **vars(args),
            "shape_fields": shape, "paper_block_ms": paper, "measured_peaks": peaks,
            "rows": rows}
  with open(args.out, "w") as f:
    json.dump(result, f, indent=2)
  print(f"wrote {args.out}")
  return result


if __name__ == "__main__":
  main()
