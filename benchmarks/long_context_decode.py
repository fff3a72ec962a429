"""Long-context decoding: Terraformer's LSH attention against dense attention (Scaling
Transformers Sec. 4.1; issue 17).

    python -m benchmarks.long_context_decode [--contexts=4096,16384,32768] [--repeats=5]
        [--d_model=512] [--n_heads=8] [--layers=2] [--d_ff=2048]
        [--out=benchmarks/long_context_decode.json]

Times one decoder step (`Terraformer.decode_position`, batch 1, unbatched as the paper
decodes) after `L` tokens of context, for two models of the same size: `terraformer` (LSH
decoder attention with the paper's 2 hashes, 128 buckets and chunks of 128, sparse FF in
blocks of 64, the 32-unit SRU branch) and `transformer` (dense causal attention, dense FF,
no SRU). Both have `--layers` decoder blocks of two attention half-residuals and one FF, and
a 32k vocabulary.

Caches are filled synthetically, not by L decode steps (dense decoding of 32k steps would
take most of an hour): random keys and values, and for LSH the buckets, in-bucket indices
and counts that `LSHSelfAttention.record_token` would have written for those keys with the
cache's own rotations (`lsh_cache`, checked against `record_token` in the smoke test). The
steps are jitted with the caches donated and threaded from call to call, as a decoding loop
runs them, so no call copies a cache.

Memory: `cache MiB` is every cache array's bytes. LSH keeps keys and values like a dense
cache, plus two int32 per token, head and hash round (bucket and index in it). Its budget
per token is the window of `n_hashes * chunk_len * (n_chunks_before + 1)` keys (512): the
`keys read` column counts the distinct cached positions that the step at `L` reads
(`prefix_window` on the filled cache), measured, not assumed; `in budget` says whether that
count stays within the window at every context. Dense attention reads all `L`.
"""

import argparse
import datetime
import json
import os
import platform
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from sparse_jax.layers.counting import count_params
from sparse_jax.layers.lsh_attention import (LSHSelfAttention, normalized_keys, prefix_window,
                                             rotation_buckets)
from sparse_jax.models.terraformer import Terraformer
from sparse_jax.models.terraformer_config import TerraformerConfig

MODELS = ("terraformer", "transformer")
PAPER_LSH = {"n_hashes": 2, "n_buckets": 128, "chunk_len": 128}


def model_config(kind: str, args: argparse.Namespace) -> TerraformerConfig:
  """The two models of the module docstring, at `args`' size."""
  terraformer = kind == MODELS[0]
  ff = ({"kind": "sparse_ff", "d_ff": args.d_ff, "block_size": args.block_size} if terraformer
        else {"kind": "dense", "d_ff": args.d_ff})
  return TerraformerConfig.parse({
      "vocab_size": args.vocab_size, "d_model": args.d_model, "n_heads": args.n_heads,
      "n_encoder_layers": 1, "n_decoder_layers": args.layers, "dropout": 0.0, "ff": ff,
      "sru_units": 32 if terraformer else 0, "encoder_attention": "dense",
      "decoder_attention": "lsh" if terraformer else "dense",
      "lsh": {**PAPER_LSH, "chunk_len": args.chunk_len}, "reversible": terraformer}, "model")


def lsh_cache(attn: LSHSelfAttention, cache: dict, key: jax.Array, length: int) -> dict:
  """`cache` (from `attn.init_cache`) holding `length` random tokens at positions 0..L-1, as
  `record_token` would have left it: normalised keys, values, and each token's bucket per
  round, its index among the earlier tokens of that bucket, and the per-bucket counts."""
  b, h, _, dh = cache["k"].shape
  k_qk, k_v = jax.random.split(key)
  qk_blhc = jax.random.normal(k_qk, (b, length, h, dh), cache["k"].dtype)
  v_bhlc = jax.random.normal(k_v, (b, h, length, dh), cache["v"].dtype)
  buckets_bhnl = rotation_buckets(qk_blhc, cache["rotations"])
  onehot_bhnlk = jax.nn.one_hot(buckets_bhnl, attn.n_buckets, dtype=jnp.int32)
  earlier_bhnlk = jnp.cumsum(onehot_bhnlk, axis=3) - onehot_bhnlk
  index_bhnl = jnp.take_along_axis(earlier_bhnlk, buckets_bhnl[..., None], axis=-1)[..., 0]
  keys_bhlc = normalized_keys(qk_blhc).transpose(0, 2, 1, 3).astype(cache["k"].dtype)
  return {**cache, "k": cache["k"].at[:, :, :length].set(keys_bhlc),
          "v": cache["v"].at[:, :, :length].set(v_bhlc),
          "buckets": cache["buckets"].at[..., :length].set(buckets_bhnl),
          "index": cache["index"].at[..., :length].set(index_bhnl),
          "counts": onehot_bhnlk.sum(axis=3)}


def dense_cache(cache: dict, key: jax.Array, length: int) -> dict:
  """A dense KV cache (`[B, H, max_len, Dh]` each) with random keys and values at positions
  0..L-1."""
  filled = dict(cache)
  for name, k in zip(("k", "v"), jax.random.split(key)):
    b, h, _, dh = cache[name].shape
    filled[name] = cache[name].at[:, :, :length].set(
        jax.random.normal(k, (b, h, length, dh), cache[name].dtype))
  return filled


def filled_caches(model: Terraformer, length: int, key: jax.Array) -> list:
  """The decoder's caches for position `length` (max_len L + 1), the first L filled."""
  caches = model.init_decoder_cache(1, length + 1)
  filled = []
  for i, (half, cache) in enumerate(zip(model.decoder, caches)):
    attn = getattr(half, "attn", None)
    if isinstance(attn, LSHSelfAttention):
      cache = lsh_cache(attn, cache, jax.random.fold_in(key, i), length)
    elif attn is not None:
      cache = dense_cache(cache, jax.random.fold_in(key, i), length)
    filled.append(cache)
  return filled


def keys_read(model: Terraformer, caches: list, length: int) -> int:
  """Most distinct cached positions an attention layer reads for a new token at `length`
  (LSH: the token recorded as `decode` does, then its `prefix_window`; dense: all
  `length + 1`). Raises if a window misses the token itself (it is always in its chunk)."""
  counts = []
  for i, (half, cache) in enumerate(zip(model.decoder, caches)):
    attn = getattr(half, "attn", None)
    if isinstance(attn, LSHSelfAttention):
      b, h, _, dh = cache["k"].shape
      qk_b1hc, v_b1hc = jax.random.normal(jax.random.key(i), (2, b, 1, h, dh))
      cache = attn.record_token(qk_b1hc, v_b1hc, cache, jnp.int32(length))
      pos_bhnw = prefix_window(cache["buckets"], cache["index"], cache["counts"],
                               jnp.int32(length), chunk_len=attn.chunk_len,
                               n_chunks_before=attn.n_chunks_before,
                               n_chunks_after=attn.n_chunks_after)
      for row in np.asarray(pos_bhnw).reshape(b * h, -1):
        read = set(row[row >= 0].tolist())
        if length not in read:
          raise AssertionError(f"layer {i}: the window at {length} misses the token itself")
        counts.append(len(read))
    elif attn is not None:
      counts.append(length + 1)
  return max(counts)


def cache_mib(caches: list) -> float:
  return sum(leaf.nbytes for leaf in jax.tree.leaves(caches)) / 2 ** 20


def median_ms(model: Terraformer, caches: list, length: int, repeats: int) -> float:
  """Median milliseconds of one jitted `decode_position` at `length`, caches donated."""
  graphdef, state = nnx.split(model)

  def step(state, caches, x_b1d):
    return nnx.merge(graphdef, state).decode_position(x_b1d, caches, jnp.int32(length))

  step = jax.jit(step, donate_argnums=(1,))
  x_b1d = jax.random.normal(jax.random.key(1), (1, 1, model.d_model))
  logits, caches = jax.block_until_ready(step(state, caches, x_b1d))  # compile
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    logits, caches = jax.block_until_ready(step(state, caches, x_b1d))
    times.append(time.perf_counter() - start)
  del logits, caches
  return 1000 * statistics.median(times)


def measure(kind: str, length: int, args: argparse.Namespace) -> dict:
  model = Terraformer(model_config(kind, args), rngs=nnx.Rngs(0))
  model.eval()
  caches = filled_caches(model, length, jax.random.key(length))
  row = {"context": length, "model": kind, "params": count_params(model),
         "cache_mib": cache_mib(caches), "keys_read": keys_read(model, caches, length)}
  row["ms_per_token"] = median_ms(model, caches, length, args.repeats)
  return row


def budget(args: argparse.Namespace) -> int:
  """LSH keys per token: `n_hashes * chunk_len * (n_chunks_before + 1)` (decoder: 1 before)."""
  return PAPER_LSH["n_hashes"] * args.chunk_len * 2


def print_table(rows: list[dict], window: int) -> None:
  print("| context | model | ms/token | cache MiB | keys read | in budget | dense / terraformer |")
  print("|---:|---|---:|---:|---:|---|---:|")
  by = {(r["context"], r["model"]): r for r in rows}
  for r in rows:
    dense = by.get((r["context"], MODELS[1]))
    ratio = (f"{dense['ms_per_token'] / r['ms_per_token']:.2f}x"
             if r["model"] == MODELS[0] and dense else "")
    in_budget = ("yes" if r["keys_read"] <= window else "no") if r["model"] == MODELS[0] else ""
    print(f"| {r['context']} | {r['model']} | {r['ms_per_token']:.2f} | {r['cache_mib']:.1f} "
          f"| {r['keys_read']} | {in_budget} | {ratio} |")


def parse_args(argv=None) -> argparse.Namespace:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--contexts", default="4096,16384,32768")
  parser.add_argument("--repeats", type=int, default=5)
  parser.add_argument("--d_model", type=int, default=512)
  parser.add_argument("--n_heads", type=int, default=8)
  parser.add_argument("--layers", type=int, default=2, help="decoder blocks")
  parser.add_argument("--d_ff", type=int, default=2048)
  parser.add_argument("--block_size", type=int, default=64, help="sparse FF block")
  parser.add_argument("--chunk_len", type=int, default=PAPER_LSH["chunk_len"])
  parser.add_argument("--vocab_size", type=int, default=32_000)
  parser.add_argument("--out", default="benchmarks/long_context_decode.json")
  return parser.parse_args(argv)


def main(argv=None) -> dict:
  args = parse_args(argv)
  rows = [measure(kind, int(length), args) for length in args.contexts.split(",")
          for kind in MODELS]
  window = budget(args)
  print_table(rows, window)
  result = {"machine": f"{platform.machine()}, {os.cpu_count()} cores, {jax.default_backend()}",
            "jax": jax.__version__, "date": datetime.date.today().isoformat(),
            "config": vars(args), "lsh": {**PAPER_LSH, "chunk_len": args.chunk_len},
            "budget_keys": window, "rows": rows}
  with open(args.out, "w", encoding="utf-8") as f:
    json.dump(result, f, indent=2)
  print(f"wrote {args.out}")
  return result


if __name__ == "__main__":
  main()
