"""Unbatched decoding speed: dense vs Scaling Transformers' sparse layers (paper Table 1).

    python benchmarks/decode.py [--d_model=1024] [--layers=4] [--out=benchmarks/decode_cpu.json]

Times one decoded token (batch 1, a KV cache of `--context` positions) for one decoder block
and for a small whole model, for the dense block (causal attention, d_ff 4096), SparseFF
(block 64), sparse QKV (S = 16 heads, d_ff 6144) and both, at d_model 1024 with 16 heads as
in the paper. Prints a table with ratios to dense and writes JSON.
"""

import argparse
import json
import os
import platform
import statistics
import time

import jax
import jax.numpy as jnp
import ml_collections
from flax import nnx

from sparse_jax.models.blocks import DecoderBlock
from sparse_jax.models.lm import TransformerLM, validate_model_config

VARIANTS = {  # name: (attention, FF config)
    "dense": ("causal", {"kind": "dense", "d_ff": 4096}),
    "sparse_ff": ("causal", {"kind": "sparse_ff", "d_ff": 4096, "block_size": 64}),
    "sparse_qkv": ("sparse_qkv", {"kind": "dense", "d_ff": 6144}),
    "sparse_ff_qkv": ("sparse_qkv", {"kind": "sparse_ff", "d_ff": 6144, "block_size": 64}),
}


def model_config(variant: str, d_model: int, n_layers: int) -> ml_collections.ConfigDict:
  attention, ff = VARIANTS[variant]
  return ml_collections.ConfigDict(dict(
      vocab_size=256, d_model=d_model, n_layers=n_layers, n_heads=16, mem_len=0,
      dropout=0.0, attention=attention, positions="rotary", ff=ff))


def median_seconds(fn, args, repeats: int) -> float:
  jax.block_until_ready(fn(*args))  # compile
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    jax.block_until_ready(fn(*args))
    times.append(time.perf_counter() - start)
  return statistics.median(times)


def time_block(cfg, context: int, repeats: int) -> float:
  block = DecoderBlock(validate_model_config(cfg), rngs=nnx.Rngs(0))
  block.eval()
  graphdef, state = nnx.split(block)
  cache = block.attn.init_cache(1, context + 1, jnp.float32)

  @jax.jit
  def step(state, cache, h_b1d):
    return nnx.merge(graphdef, state).decode(h_b1d, cache, jnp.int32(context))

  h = jax.random.normal(jax.random.key(0), (1, 1, cfg.d_model))
  return median_seconds(step, (state, cache, h), repeats)


def time_model(cfg, context: int, repeats: int) -> float:
  lm = TransformerLM(cfg, rngs=nnx.Rngs(0))
  lm.eval()
  graphdef, state = nnx.split(lm)
  cache = lm.init_cache(1, context + 1)
  cache["position"] = jnp.int32(context)

  @jax.jit
  def step(state, cache, tokens_b1):
    return nnx.merge(graphdef, state).decode_step(tokens_b1, cache)

  return median_seconds(step, (state, cache, jnp.zeros((1, 1), jnp.int32)), repeats)


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--d_model", type=int, default=1024)
  parser.add_argument("--layers", type=int, default=4, help="Layers of the whole model.")
  parser.add_argument("--context", type=int, default=128, help="Cached positions.")
  parser.add_argument("--repeats", type=int, default=50)
  parser.add_argument("--out", default="benchmarks/decode_cpu.json")
  args = parser.parse_args()
  rows = []
  for name in VARIANTS:
    cfg = model_config(name, args.d_model, args.layers)
    rows.append({"variant": name,
                 "block_ms": 1000 * time_block(cfg, args.context, args.repeats),
                 "model_ms": 1000 * time_model(cfg, args.context, args.repeats)})
  dense = rows[0]
  print(f"{'variant':<14} {'block ms':>9} {'x dense':>8} {'model ms':>9} {'x dense':>8}")
  for r in rows:
    r["block_speedup"] = dense["block_ms"] / r["block_ms"]
    r["model_speedup"] = dense["model_ms"] / r["model_ms"]
    print(f"{r['variant']:<14} {r['block_ms']:>9.3f} {r['block_speedup']:>8.2f} "
          f"{r['model_ms']:>9.3f} {r['model_speedup']:>8.2f}")
  result = {"machine": f"{platform.machine()}, {os.cpu_count()} cores, "
                       f"{jax.default_backend()}", "jax": jax.__version__, **vars(args),
            "rows": rows}
  with open(args.out, "w") as f:
    json.dump(result, f, indent=2)
  print(f"wrote {args.out}")


if __name__ == "__main__":
  main()
