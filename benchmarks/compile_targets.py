"""Every kernel and paper config compiled for GPUs and TPUs we do not have (compiled, not run).

    python -m benchmarks.compile_targets --out benchmarks/compile_targets
    python -m benchmarks.compile_targets --out /tmp/ct --parts=kernels --targets=h100
    python -m benchmarks.compile_targets --out /tmp/ct --parts=kernels --impls=mosaic
    python -m benchmarks.compile_targets --out /tmp/ct --parts=configs --bisect
    python -m benchmarks.compile_targets --out /tmp/ct --parts=configs --config_targets=v5e \
        --configs sigma_moe_paper.py:wt103_b "moe_variants.py:wt103_s,switch"

Needs the compile extra (`pip install -e ".[compile]"`). Writes `compile_targets.json` and
`compile_targets.md` (the tables of benchmarks/RESULTS.md) into `--out`, printing each row as
it comes.

- kernels: forward + backward of `expert_mlp` (the MoE layer's path) and `cvmm` at the paper's
  shapes (32768 tokens, d_model 412/1024, G 128, K 4, N_E 16/32/128) with every kernel family
  the target uses (`pallas` Triton and `mosaic` on H100/H200, `pallas` on A100, `megablox` on
  TPU v5e) and, for contrast, `ragged`: compiled or the error, XLA's temporary memory, and
  for Triton and Mosaic GPU kernels ptxas's registers, spills and occupancy
  (`aot.kernel_resources`).
- configs: the training step of each paper config (`sigma_moe_paper`, `dense_paper`, the main
  `moe_variants` rows, `scaling_small`, `terraformer_arxiv:paper`, SPARTAN on a RoBERTa-base
  architecture, SwitchHead's WT-103 models and MoEUT's 44M and 244M) on one device of each
  target: peak memory per device, fits or not; with `--bisect`, the largest batch (the config's
  times a power of two) that fits.
"""

import argparse
import contextlib
import functools
import importlib
import json
import os
import tempfile
import time

from sparse_jax.aot import targets

targets.use_cpu_backend()  # Before anything else touches JAX.

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from jax.sharding import NamedSharding, PartitionSpec as P  # noqa: E402

# The tables describe what training compiles, even where the environment asks for fast,
# unoptimised compiles (JAX_DISABLE_MOST_OPTIMIZATIONS, as the test suite sets): without
# optimisation Triton's kernels use other registers and may spill.
jax.config.update("jax_disable_most_optimizations", False)

import pallas_kernels  # noqa: E402
from sparse_jax.aot import kernel_resources, memory  # noqa: E402
from sparse_jax.tasks import task_for  # noqa: E402
from sparse_jax.training.compile_only import DoesNotFitError, compile_task  # noqa: E402

TOKENS, GROUP, K = 32768, 128, 4
D_MODELS, N_EXPERTS = (412, 1024), (16, 32, 128)
IMPLS = {"h100": ("pallas", "mosaic", "ragged"), "h200": ("pallas", "mosaic", "ragged"),
         "a100": ("pallas", "ragged"), "v5e": ("megablox", "ragged")}
CONFIGS = ("sigma_moe_paper.py:wt103_s", "sigma_moe_paper.py:wt103_s_star",
           "sigma_moe_paper.py:wt103_b", "sigma_moe_paper.py:e8", "dense_paper.py:wt103_s",
           "dense_paper.py:wt103_s_star", "dense_paper.py:wt103_b",
           "moe_variants.py:wt103_s,switch", "moe_variants.py:wt103_s,noisy_topk",
           "moe_variants.py:wt103_s,sbase", "moe_variants.py:wt103_s,pkm_relu",
           "scaling_small.py:dense", "scaling_small.py:ff_qkv_loss",
           "terraformer_arxiv.py:paper", "glue.py:rte,spartan",
           "switchhead_paper.py:wt103_s,switchhead", "switchhead_paper.py:wt103_b,switchhead",
           "moeut_paper.py:44m,moeut", "moeut_paper.py:244m,moeut")
MAX_BATCH_FACTOR = 16  # --bisect stops doubling at 16x the config's batch.
# RoBERTa-base's architecture (its config.json on the Hugging Face hub): SPARTAN compiles on
# its shapes; no weights are needed to compile.
ROBERTA_BASE = {"vocab_size": 50265, "hidden_size": 768, "num_hidden_layers": 12,
                "num_attention_heads": 12, "intermediate_size": 3072,
                "max_position_embeddings": 514, "type_vocab_size": 1, "pad_token_id": 1,
                "hidden_act": "gelu", "layer_norm_eps": 1e-5}


def _moe_step(op: str, impl: str):
  def loss(x_nd, sel_nk, gates_nk, w1_edg, w2_egd):
    if op == "cvmm":
      h_nkg = jax.nn.relu(pallas_kernels.cvmm(x_nd, sel_nk, w1_edg, impl=impl))
      y_nd = pallas_kernels.cvmm(h_nkg, sel_nk, w2_egd, gates_nk, impl=impl)
    else:
      y_nd = pallas_kernels.expert_mlp(x_nd, sel_nk, gates_nk, w1_edg, w2_egd, impl=impl)
    return jnp.sum(y_nd.astype(jnp.float32))
  return jax.jit(jax.grad(loss, argnums=(0, 2, 3, 4)))


def kernel_row(target, op, impl, d_model, n_experts, dtype) -> dict:
  """One compile of `op`'s forward + backward, with its memory and kernel resources."""
  row = {"target": target.name, "op": op, "impl": impl, "d_model": d_model,
         "n_experts": n_experts, "dtype": jnp.dtype(dtype).name}
  mesh = targets.one_device_mesh(target)
  sharding = NamedSharding(mesh, P())
  shapes = [((TOKENS, d_model), dtype), ((TOKENS, K), jnp.int32), ((TOKENS, K), dtype),
            ((n_experts, d_model, GROUP), dtype), ((n_experts, GROUP, d_model), dtype)]
  args = [jax.ShapeDtypeStruct(s, t, sharding=sharding) for s, t in shapes]
  with tempfile.TemporaryDirectory(prefix="compile_targets_") as dump:
    started = time.perf_counter()
    mosaic = target.platform == "gpu" and impl == "mosaic"
    try:
      with jax.set_mesh(mesh), (kernel_resources.mosaic_dump(dump) if mosaic
                                else contextlib.nullcontext()):
        lowered = _moe_step(op, impl).trace(*args).lower(
            lowering_platforms=(target.lowering_platform,))
        options = kernel_resources.dump_options(dump) if target.platform == "gpu" else None
        compiled = lowered.compile(options)
    except Exception as e:  # The compiler's or our refusal: recorded, not fatal.
      return {**row, "compiled": False,
              "error": f"{type(e).__name__}: {str(e).splitlines()[0]}"}
    row.update(compiled=True, compile_seconds=round(time.perf_counter() - started, 1),
               temp_gib=memory.MemoryUse.of(compiled).temporary / memory.GIB)
    if target.platform == "gpu" and impl in ("pallas", "mosaic"):
      read = (kernel_resources.mosaic_kernel_resources if mosaic
              else kernel_resources.kernel_resources)
      row["kernels"] = [vars(k) | {"grid": list(k.grid)} for k in read(dump, target)]
  return row


def kernel_rows(target_names, impls, quick: bool):
  for name in target_names:
    target = targets.parse_target(name)
    for impl in [i for i in IMPLS[name] if impls is None or i in impls]:
      for d_model in D_MODELS[:1] if quick else D_MODELS:
        for n_experts in N_EXPERTS[:1] if quick else N_EXPERTS:
          for dtype in (jnp.bfloat16,) if impl == "mosaic" else (jnp.bfloat16, jnp.float32):
            yield kernel_row(target, "expert_mlp", impl, d_model, n_experts, dtype)
      yield kernel_row(target, "cvmm", impl, 1024, 128, jnp.bfloat16)


def _config(name: str, roberta_dir: str):
  module, _, argument = name.partition(":")
  config = importlib.import_module(f"sparse_jax.configs.{module.removesuffix('.py')}").get_config(
      argument or None)
  if name.startswith("glue"):
    config.backbone.path = roberta_dir
  if config.data.get("name") == "text_files" and not config.data.get("file"):
    config.data.file = os.devnull  # The user's text (MoEUT's C4): compiling reads none.
  return config


def config_row(target, name: str, roberta_dir: str, batch_size: int | None = None,
               overrides: dict | None = None) -> dict:
  """`name` compiled for one device of `target` (`overrides`: dotted config fields)."""
  config = _config(name, roberta_dir)
  config.mesh.update(data=1, fsdp=1, expert=1)
  for dotted, value in (overrides or {}).items():
    *sections, field = dotted.split(".")
    functools.reduce(lambda c, key: c[key], sections, config)[field] = value
  batch = config.train if "batch_size" in config.train else config.data
  if batch_size:
    batch.batch_size = batch_size
  row = {"target": target.name, "config": name, "batch_size": batch.batch_size}
  started = time.perf_counter()
  try:
    compiled = compile_task(task_for(config), target)
  except DoesNotFitError as e:  # libtpu's verdict: too large, so no executable.
    return {**row, "compiled": False, "fits": False, "error": str(e.__cause__).splitlines()[0]}
  except Exception as e:  # noqa: BLE001  The compiler's error is the result.
    return {**row, "compiled": False, "error": f"{type(e).__name__}: {str(e).splitlines()[0]}"}
  return {**row, "compiled": True, "compile_seconds": round(time.perf_counter() - started, 1),
          "train_gib": compiled.train_use.total / memory.GIB,
          "eval_peak_gib": compiled.eval_peak / memory.GIB,
          "peak_gib": compiled.peak / memory.GIB,
          "device_gib": target.memory_bytes / memory.GIB, "fits": compiled.fits,
          "xla_options": compiled.xla_options}


def largest_batch(target, name: str, roberta_dir: str, first: dict) -> int | None:
  """The largest batch `config's batch x 2^k` whose step fits on one device, searched from
  the config's own batch (`first`, already compiled): doubling while it fits, halving while
  it does not. None: not even a batch of 1 fits."""
  size, fits = first["batch_size"], first["fits"]
  step = 2 if fits else 0.5
  best = size if fits else None
  while 1 <= size * step <= MAX_BATCH_FACTOR * first["batch_size"]:
    size = int(size * step)
    row = config_row(target, name, roberta_dir, size)
    print(f"    batch {size}: peak {row.get('peak_gib', row.get('error'))}", flush=True)
    if row.get("fits") != fits:
      return size if not fits and row.get("fits") else best
    best = size if fits else None
  return best


def config_rows(target_names, config_names, roberta_dir: str, bisect: bool):
  for name in target_names:
    target = targets.parse_target(name)
    for config in config_names:
      row = config_row(target, config, roberta_dir)
      if bisect and "fits" in row:
        row["largest_batch"] = largest_batch(target, config, roberta_dir, row)
      yield row


def markdown(rows: list[dict]) -> str:
  kernels = [r for r in rows if "op" in r]
  configs = [r for r in rows if "config" in r]
  lines = ["**Compiled, not run.**", "", "| target | op | impl | d_model | N_E | dtype | "
           "compiled | temp GiB | kernels: registers / spills / shared KiB / occupancy |",
           "|---|---|---|---|---|---|---|---|---|"]
  for r in kernels:
    res = "; ".join(f"{k['name']} {k['registers']} / {k['spill_stores'] + k['spill_loads']} B"
                    f" / {k['shared_bytes'] // 1024} / {k['occupancy']:.0%}"
                    for k in r.get("kernels", []))
    if r["compiled"] and r["impl"] == "mosaic" and not res:
      res = "the kernels of an earlier row (the plugin compiles a kernel once per process)"
    status = "yes" if r["compiled"] else f"no: {r['error'][:120]}"
    temp = f"{r['temp_gib']:.2f}" if r["compiled"] else ""
    lines.append(f"| {r['target']} | {r['op']} | {r['impl']} | {r['d_model']} | "
                 f"{r['n_experts']} | {r['dtype']} | {status} | {temp} | {res} |")
  lines += ["", "| target | config | batch | compiled | train GiB | eval peak GiB | device GiB "
            "| fits | largest batch | XLA options |", "|---|---|---|---|---|---|---|---|---|---|"]
  for r in configs:
    if not r["compiled"]:
      fits = "no" if r.get("fits") is False else ""  # libtpu's refusal: too large.
      lines.append(f"| {r['target']} | {r['config']} | {r['batch_size']} | no: "
                   f"{r['error'][:160]} | | | | {fits} | {_largest(r)} | |")
      continue
    lines.append(f"| {r['target']} | {r['config']} | {r['batch_size']} | yes | "
                 f"{r['train_gib']:.2f} | {r['eval_peak_gib']:.2f} | {r['device_gib']:.1f} | "
                 f"{'yes' if r['fits'] else 'no'} | {_largest(r)} | "
                 f"{r['xla_options'] or ''} |")
  return "\n".join(lines) + "\n"


def _largest(row: dict) -> str:
  """The bisection's answer; at its cap (`MAX_BATCH_FACTOR`), a lower bound."""
  largest = row.get("largest_batch", "")
  if largest and largest >= MAX_BATCH_FACTOR * row["batch_size"]:
    return f">= {largest}"
  return "none" if "largest_batch" in row and largest is None else str(largest)


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--out", required=True)
  parser.add_argument("--targets", default="h100,h200,a100,v5e")
  parser.add_argument("--config_targets", default="h100,a100,v5e")
  parser.add_argument("--configs", nargs="+", default=list(CONFIGS),
                      help="config names as in CONFIGS (default: all of them)")
  parser.add_argument("--parts", default="kernels,configs")
  parser.add_argument("--impls", help="comma-separated kernel families (default: all)")
  parser.add_argument("--bisect", action="store_true")
  parser.add_argument("--quick", action="store_true", help="one shape per kernel family")
  args = parser.parse_args()
  os.makedirs(args.out, exist_ok=True)
  rows = []
  with tempfile.TemporaryDirectory() as roberta_dir:
    with open(os.path.join(roberta_dir, "config.json"), "w", encoding="utf-8") as f:
      json.dump(ROBERTA_BASE, f)
    for name in args.configs if "configs" in args.parts else ():
      _config(name, roberta_dir)  # A misspelt config fails now, not an hour in.
    parts = args.parts.split(",")
    sources = []
    if "kernels" in parts:
      impls = args.impls.split(",") if args.impls else None
      sources.append(kernel_rows(args.targets.split(","), impls, args.quick))
    if "configs" in parts:
      sources.append(config_rows(args.config_targets.split(","), args.configs,
                                 roberta_dir, args.bisect))
    for source in sources:
      for row in source:
        print(json.dumps({k: v for k, v in row.items() if k != "kernels"}), flush=True)
        rows.append(row)
        _write(args.out, rows)
  print(markdown(rows))


def _write(out: str, rows: list[dict]) -> None:
  """Both files after every row: a long run stopped early keeps what it compiled."""
  with open(os.path.join(out, "compile_targets.json"), "w", encoding="utf-8") as f:
    json.dump({"jax": jax.__version__, "rows": rows}, f, indent=1)
  with open(os.path.join(out, "compile_targets.md"), "w", encoding="utf-8") as f:
    f.write(markdown(rows))


if __name__ == "__main__":
  with contextlib.suppress(KeyboardInterrupt):
    main()
