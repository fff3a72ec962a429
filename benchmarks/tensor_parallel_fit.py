"""Whether models too big for one device fit 8 TPU chips, with and without `mesh.tensor`.

    python -m benchmarks.tensor_parallel_fit --out=benchmarks/tensor_parallel_fit_tpu.json
    python -m benchmarks.tensor_parallel_fit --out=benchmarks/tensor_parallel_fit_tpu.json \
        --models=decode_dense --targets=v5e:2x4 --meshes=tensor=8 --largest

Compiled, not run (issue 74, "it fits where it did not"): each step is built as training or
decoding would build it, as shapes only, on the abstract devices of a TPU slice
(`sparse_jax.aot.targets`, libtpu) in each mesh, and compiled by libtpu. Models (`MODELS`):

- `moe_train`: a sigma-MoE LM of 11.3B parameters, the training step as `train.py
  --compile_only` compiles it (`training.compile_only.compile_task`): `sigma_moe_paper:wt103_b`
  (Transformer-XL, memory 512, context 512, batch 64, K 4, Adam) widened to d_model 4096, 32
  layers, 32 heads of 128, 64 experts of G 512; bfloat16 compute (parameters and Adam's
  moments float32), `remat=block`, layers scanned, the `blocked` expert matmuls (the TPU
  kernel is not split over `tensor` yet). Its memory is the larger of the training step and
  evaluation beside the resident training state (`CompiledTask.peak`).
- `decode_dense`, `decode_sparse`: `scaling_17b:dense` and `scaling_17b:ff_qkv` (17.4B and
  17.8B parameters), one decoding step (`TransformerLM.decode_step`, the cache donated as
  `sparse_jax.generate` does) at batch 1 with a KV cache of `--max_len` positions; float32
  weights as the library stores them, bfloat16 compute.

Per device: XLA's memory analysis (`aot.memory.MemoryUse`: arguments + outputs - aliased +
temporaries + code) against the chip's HBM (`targets.toml`). libtpu refuses to compile a
program larger than its chip (its own limit, 15.75 GiB on a v5e): such a row is "does not
fit" with the memory libtpu says the program requires (its message calls it the HLO
temporaries' and counts the weights in it), and no breakdown. With `--largest`,
the largest `n_layers` (step: one layer, width and everything else fixed) whose step compiles
and fits, per model, target and mesh (`largest_layers`). Rows already in `--out` (same model,
target, mesh, layers) are kept, not compiled again, so a stopped run resumes. Needs the compile
extra (libtpu); compiles take minutes each on a small machine.
"""

import argparse
import contextlib
import functools
import json
import math
import os
import re
import time

from sparse_jax.aot import targets

targets.use_cpu_backend()  # Before anything else touches JAX.

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from flax import nnx  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402

# The tables describe what training compiles, even under JAX_DISABLE_MOST_OPTIMIZATIONS.
jax.config.update("jax_disable_most_optimizations", False)

from benchmarks.machine import machine_info, write_json  # noqa: E402
from sparse_jax import parallel, validation  # noqa: E402
from sparse_jax.aot import memory  # noqa: E402
from sparse_jax.configs import scaling_17b, sigma_moe_paper  # noqa: E402
from sparse_jax.layers.counting import count_params  # noqa: E402
from sparse_jax.models.lm import TransformerLM  # noqa: E402
from sparse_jax.models.lm_config import validate_model_config  # noqa: E402
from sparse_jax.models.tensor_support import check_tensor_parallel  # noqa: E402
from sparse_jax.tasks import task_for  # noqa: E402
from sparse_jax.training.compile_only import (DoesNotFitError, compile_for,  # noqa: E402
                                              compile_task, lower_for)

TARGETS = ("v5e:2x4", "v5p:2x2x2")
MOE_MODEL = {"d_model": 4096, "n_layers": 32, "n_heads": 32, "head_dim": 128,
             "dtype": "bfloat16", "remat": "block", "scan_layers": True}
MOE_FF = {"n_experts": 64, "expert_size": 512, "impl": "blocked"}  # K 4: the paper's.
# name: (what is compiled, the config's variant, meshes); "data=8" at batch 1: every chip
# holds the whole model (the batch of 1 is not split).
MODELS = {
    "moe_train": ("train", None, ("fsdp=8", "fsdp=4,tensor=2", "tensor=8", "expert=8",
                                  "expert=4,tensor=2")),
    "decode_dense": ("decode", "dense", ("data=8", "fsdp=8", "fsdp=4,tensor=2", "tensor=8",
                                         "data=2,tensor=4")),
    "decode_sparse": ("decode", "ff_qkv", ("data=8", "fsdp=8", "fsdp=4,tensor=2", "tensor=8",
                                           "data=2,tensor=4")),
}
MOE_EVAL_BATCH = 8  # The paper's 4 streams do not split over 8 chips.
MAX_PROBES = 8  # `largest_layers` compiles at most this many sizes beyond its first two.
# libtpu's refusal: "... required for HLO temporaries (65.64G) exceeds available HBM (15.75G)".
_LIBTPU_NEEDS = re.compile(r"\(([\d.]+)G\) exceeds available HBM \(([\d.]+)G\)")


def parse_mesh(text: str) -> dict[str, int]:
  """`"fsdp=4,tensor=2"` as `mesh` section sizes (the others 1); raises `ConfigError` naming
  `--meshes` for an unknown axis or a size that is not a positive integer."""
  sizes = dict.fromkeys(parallel.MESH_AXES, 1)
  for part in text.split(","):
    axis, _, size = part.partition("=")
    validation.require(axis in sizes and size.isdigit() and int(size) >= 1, "--meshes",
                       f"AXIS=N[,AXIS=N...] with AXIS one of {parallel.MESH_AXES} and N >= 1",
                       text)
    sizes[axis] = int(size)
  return sizes


def model_config(model: str, n_layers: int, mesh: dict[str, int]):
  """The config of `model` (`MODELS`) with `n_layers` layers on `mesh`."""
  kind, variant, _ = MODELS[model]
  if kind == "train":
    config = sigma_moe_paper.get_config("wt103_b")
    config.model.update(MOE_MODEL)
    config.model.ff.update(MOE_FF)
    config.eval.batch_size = MOE_EVAL_BATCH
  else:
    config = scaling_17b.get_config(variant)
  config.model.n_layers = n_layers
  config.mesh = mesh
  return config


def train_row(config, target: targets.Target) -> dict:
  """The training step's memory per device (`compile_task`: what `--compile_only` prints)."""
  compiled = compile_task(task_for(config), target)
  use = compiled.train_use
  return {"peak_gib": compiled.peak / memory.GIB, "train_gib": use.total / memory.GIB,
          "eval_peak_gib": compiled.eval_peak / memory.GIB, **_parts(use)}


def _parts(use: memory.MemoryUse) -> dict:
  return {"arguments_gib": use.arguments / memory.GIB, "temporary_gib": use.temporary / memory.GIB}


def placed(shapes, shardings):
  """`shapes` as ShapeDtypeStructs in `shardings` (the same structure)."""
  return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                      shapes, shardings)


def decode_row(config, target: targets.Target, max_len: int) -> dict:
  """One decoding step at batch 1 after a cache of `max_len` positions, compiled for
  `target` in `config.mesh`: the weights in their shardings (`parallel.state_shardings`), the
  cache in those its constructor gives it (split by head over `tensor`), donated."""
  model = validate_model_config(config.model)
  mesh = parallel.make_mesh(parallel.mesh_shape(config.mesh, target.n_devices),
                            targets.target_devices(target))
  check_tensor_parallel(model, parallel.axis_size(mesh, parallel.TENSOR))
  with jax.set_mesh(mesh):
    lm = nnx.eval_shape(lambda: TransformerLM(model, rngs=nnx.Rngs(0)))
    lm.eval()
    graphdef, state = nnx.split(lm)
    state = placed(state, parallel.state_shardings(state, mesh))
    init_cache = jax.jit(lambda: lm.init_cache(1, max_len))
    cache_shardings = compile_for(lower_for(init_cache.trace(), target), target)[0]
    cache = placed(jax.eval_shape(init_cache), cache_shardings.output_shardings)
    rows = parallel.partition_spec(("batch", None), (1, 1), mesh)
    tokens_b1 = jax.ShapeDtypeStruct((1, 1), jnp.int32, sharding=NamedSharding(mesh, rows))

    @functools.partial(jax.jit, donate_argnums=1)
    def step(state, cache, tokens_b1):
      logits_b1v, cache = nnx.merge(graphdef, state).decode_step(tokens_b1, cache)
      return jnp.argmax(logits_b1v, axis=-1), cache

    compiled = compile_for(lower_for(step.trace(state, cache, tokens_b1), target), target)[0]
  use = memory.MemoryUse.of(compiled)
  return {"peak_gib": use.total / memory.GIB, **_parts(use)}


def measure(model: str, target: targets.Target, mesh: str, n_layers: int,
            max_len: int) -> dict:
  """One row: `model` with `n_layers` on `target` in `mesh`, compiled; its parameters, memory
  per device and verdict, or libtpu's refusal, or the error that stopped the compile."""
  config = model_config(model, n_layers, parse_mesh(mesh))
  params = count_params(nnx.eval_shape(
      lambda: TransformerLM(validate_model_config(config.model), rngs=nnx.Rngs(0))))
  row = {"model": model, "target": str(target), "mesh": mesh, "n_layers": n_layers,
         "params": params, "device_gib": target.memory_bytes / memory.GIB}
  started = time.perf_counter()
  try:
    row.update(train_row(config, target) if MODELS[model][0] == "train"
               else decode_row(config, target, max_len))
  except DoesNotFitError as e:  # libtpu's verdict: too large, so no executable.
    message = str(e.__cause__).splitlines()[0]
    needs = _LIBTPU_NEEDS.search(message)
    row.update(fits=False, error=message,
               libtpu_required_gib=float(needs.group(1)) if needs else None)
  except Exception as e:  # noqa: BLE001  The compiler's or the config check's error.
    row.update(fits=None, error=f"{type(e).__name__}: {str(e).splitlines()[0]}")
  else:
    row["fits"] = row["peak_gib"] <= row["device_gib"]
  row["compile_seconds"] = round(time.perf_counter() - started, 1)
  return row


def largest_layers(fits_at, device_gib: float, first: int = 2, second: int = 4
                   ) -> tuple[int | None, int | None]:
  """`(largest n_layers that fits, smallest that does not)`, stepping one layer.

  `fits_at(n)` compiles `n` layers: `(fits, peak GiB or None)`. Memory is nearly affine in
  the layers (each adds the same weights, optimiser state, cache and stored activations), so
  the line through the two measured sizes nearest the boundary predicts where `device_gib`
  is reached (`predicted_largest`); each compile there adds a point nearer the boundary and
  the next prediction uses it (a secant search), until a size fits and the next one does not
  (at most `MAX_PROBES` compiles). A size libtpu refuses has no peak (XLA's comes only with
  a compiled program) and adds no point, so the search then walks one layer below it.
  `(None, first)`: not even `first` fits; an upper bound of None: every size tried fits;
  bounds more than one layer apart: the search ran out of probes.
  """
  peaks = {}

  def fits(n_layers: int) -> bool:
    ok, peak = fits_at(n_layers)
    if peak is not None:
      peaks[n_layers] = peak
    return ok

  if not fits(first):
    return None, first
  lo, hi = (second, None) if fits(second) else (first, second)
  for _ in range(MAX_PROBES):
    if hi is not None and hi - lo <= 1:
      break
    guess = max(lo + 1, predicted_largest(peaks, lo, device_gib))
    guess = guess if hi is None else min(guess, hi - 1)
    lo, hi = (guess, hi) if fits(guess) else (lo, guess)
  return lo, hi


def predicted_largest(peaks: dict[int, float], lo: int, device_gib: float) -> int:
  """The largest size within `device_gib` on the line through the two sizes in `peaks`
  nearest `lo` (the largest that fits); `lo + 1` with fewer than two, `2 lo` for a line that
  does not grow."""
  if len(peaks) < 2:
    return lo + 1
  n_1, n_2 = sorted(sorted(peaks, key=lambda n: abs(n - lo))[:2])
  per_layer = (peaks[n_2] - peaks[n_1]) / (n_2 - n_1)
  if per_layer <= 0:
    return 2 * lo
  return n_1 + math.floor((device_gib - peaks[n_1]) / per_layer)


class LayerProbe:
  """`fits_at(n)` for `largest_layers`: one model, target and mesh, each size compiled once
  (`measure`) and its row kept in `rows` (shared with the output)."""

  def __init__(self, rows: list[dict], save, model: str, target: targets.Target, mesh: str,
               max_len: int):
    self.rows, self.save, self.max_len = rows, save, max_len
    self.model, self.target, self.mesh = model, target, mesh

  def __call__(self, n_layers: int) -> tuple[bool, float | None]:
    row = find_row(self.rows, self.model, str(self.target), self.mesh, n_layers)
    if row is None:
      row = measure(self.model, self.target, self.mesh, n_layers, self.max_len)
      self.rows.append(row)
      self.save()
      print(json.dumps(row), flush=True)
    return bool(row["fits"]), row.get("peak_gib")


def find_row(rows: list[dict], model: str, target: str, mesh: str, n_layers: int):
  return next((r for r in rows if (r["model"], r["target"], r["mesh"], r["n_layers"])
               == (model, target, mesh, n_layers)), None)


def nominal_layers(model: str) -> int:
  return MOE_MODEL["n_layers"] if MODELS[model][0] == "train" else scaling_17b.N_LAYERS


def table(rows: list[dict], largest: list[dict]) -> str:
  """The nominal models' rows and the largest sizes found, as Markdown."""
  lines = ["| model | target | mesh | layers | params (B) | GiB per device | of which weights "
           "etc. | temporaries | verdict |", "|---|---|---|---|---|---|---|---|---|"]
  for r in rows:
    if r["n_layers"] != nominal_layers(r["model"]):
      continue
    if "peak_gib" in r:
      used = (f"{r['peak_gib']:.2f} | {r['arguments_gib']:.2f} | {r['temporary_gib']:.2f} | "
              f"{memory.verdict(r['peak_gib'] * memory.GIB, r['device_gib'] * memory.GIB)}")
    elif r["fits"] is False:
      needs = r.get("libtpu_required_gib")
      used = f"{'' if needs is None else needs} (libtpu's figure) | | | does not fit"
    else:
      used = f"| | | error: {r['error'][:100]}"
    lines.append(f"| {r['model']} | {r['target']} | {r['mesh']} | {r['n_layers']} | "
                 f"{r['params'] / 1e9:.1f} | {used} |")
  if largest:
    lines += ["", "| model | target | mesh | largest layers that fit | its params (B) | first "
              "that does not |", "|---|---|---|---|---|---|"]
    for r in largest:
      params = "" if r["params"] is None else f"{r['params'] / 1e9:.1f}"
      lines.append(f"| {r['model']} | {r['target']} | {r['mesh']} | {r['largest']} | "
                   f"{params} | {r['first_too_big'] or ''} |")
  return "\n".join(lines) + "\n"


def run(args, rows: list[dict], save) -> list[dict]:
  """Compiles every model, target and mesh asked for (`rows` gains each new row); returns
  the `--largest` results."""
  largest = []
  for target_name in args.targets.split(","):
    target = targets.parse_target(target_name)
    for model in args.models.split(","):
      for mesh in args.meshes.split(";") if args.meshes else MODELS[model][2]:
        probe = LayerProbe(rows, save, model, target, mesh, args.max_len)
        probe(nominal_layers(model))
        if args.largest:
          lo, hi = largest_layers(probe, target.memory_bytes / memory.GIB)
          found = lo and find_row(rows, model, str(target), mesh, lo)
          largest.append({"model": model, "target": str(target), "mesh": mesh, "largest": lo,
                          "first_too_big": hi, "params": found["params"] if found else None})
  return largest


def main(argv=None) -> dict:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--out", required=True)
  parser.add_argument("--targets", default=",".join(TARGETS))
  parser.add_argument("--models", default=",".join(MODELS))
  parser.add_argument("--meshes", help="';'-separated meshes like 'fsdp=4,tensor=2' "
                      "(default: each model's, `MODELS`)")
  parser.add_argument("--max_len", type=int, default=1024, help="KV cache positions.")
  parser.add_argument("--largest", action="store_true",
                      help="Also search the largest n_layers that fits (`largest_layers`).")
  args = parser.parse_args(argv)
  unknown = set(args.models.split(",")) - set(MODELS)
  if unknown:
    parser.error(f"--models must be a comma-separated subset of {list(MODELS)}; got "
                 f"{sorted(unknown)}.")
  for mesh in args.meshes.split(";") if args.meshes else ():
    parse_mesh(mesh)
  result = {"jax": jax.__version__, "machine": machine_info(), "max_len": args.max_len,
            "rows": [], "largest": []}
  if os.path.exists(args.out):
    with open(args.out, encoding="utf-8") as f:
      kept = json.load(f)
    # Rows that did not compile for a reason of ours (not libtpu's "too large") run again.
    result.update(rows=[r for r in kept["rows"] if r["fits"] is not None],
                  largest=kept["largest"])
  save = lambda: write_json(result, args.out)
  found = run(args, result["rows"], save)
  result["largest"] = [r for r in result["largest"] if not any(
      (r["model"], r["target"], r["mesh"]) == (n["model"], n["target"], n["mesh"])
      for n in found)] + found
  save()
  print(table(result["rows"], result["largest"]))
  return result


if __name__ == "__main__":
  with contextlib.suppress(KeyboardInterrupt):
    main()
