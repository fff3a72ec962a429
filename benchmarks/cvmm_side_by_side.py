"""Side by side on one GPU: our `cvmm`, the authors' CVMM kernels, ScatterMoE and the dense probe.

    python -m benchmarks.cvmm_side_by_side --stage_theirs=third_party   # where the mirrors are
    python -m benchmarks.cvmm_side_by_side --theirs=third_party --budget_s=300 \
        --output=OUT/cvmm_side_by_side.json                                 # on a GPU
    python -m benchmarks.cvmm_side_by_side --tokens=512 --d_models=128 --experts=8 \
        --output=/tmp/sbs.json                                              # on a CPU

Two projections of a sigma-MoE feed-forward at T tokens, K slots each, N_E experts of G units,
in bfloat16, forward and forward + backward, each timed in the same run as:
  up:   y [T, K, G] = x [T, d] @ w[sel] (x shared by a token's K slots, w [N_E, d, G]);
        gradients of x and w.
  down: y [T, d] = sum_k gates[t, k] * h [T, K, G] @ w[sel] (one input row per slot,
        w [N_E, G, d]); gradients of h, w and the gates.
- ours (JAX): `pallas_kernels.cvmm` with `--impl` (default pallas on a GPU, blocked elsewhere,
  so the script runs on a CPU); the time includes the sort of the slots by expert, which
  `cvmm` does inside every call.
- probe (JAX) and probe_torch: cvmm_codex's "dense-equivalent probe" (its README: "a single
  shared dense weight with pre-materialized route-shaped input and the same number of route
  matmuls"; selection excluded). The probe's code is not in their repository; we read it as:
  up, [T*K, d] rows (x repeated K times, made before timing) @ one W [d, G]; down, [T*K, G]
  rows @ one W [G, d], then the gates applied and the K slots summed (elementwise, as `cvmm`
  does), so the output is the op's [T, d]. Its matmul FLOPs equal the op's routed FLOPs,
  2*T*K*M*L forward and 3x that forward + backward (`matmul_flops` counts them in the jaxpr).
  `x_probe` is a row's time over its own framework's probe (the JAX probe is compiled once
  per d_model and timed in the same interleaved rounds as each shape's cells): cvmm_codex
  reports 2.58x for the up projection at d 1024 and 1.02x for the gate-weighted down (A100,
  16384 tokens, K 8, N_E 512, not our shapes); our goals are <= 1.3x and <= 1.05x (`GOALS`,
  forward + backward).
- theirs (PyTorch, `--theirs=DIR`): each from its fetched source in DIR, in a subprocess of its
  own (`--_worker`; moe_layer and cvmm_codex both register the torch op `mylib::cvmm_triton`,
  so they cannot share a process); timed with torch.cuda.Event, the median of `--repeats`
  samples after a warm-up (which runs Triton's autotuning). Their selection preprocessing
  (the sort) is timed apart as `prep_ms` and is not in `ms`, as in cvmm_codex's README; ours
  has it inside `ms`. A row whose torch, CUDA or source is missing reads "skipped: <why>".
Inputs are identical on both sides: numpy arrays from `--seed`, rounded to bfloat16 values
(`make_inputs`), copied to each framework. Before timing, each side runs one small shape
(`--check_tokens`, `--check_experts`) and its output and gradients are compared with a float64
numpy reference of the same op (`reference_up`, `reference_down`); `checks` in the JSON holds
each error (max |a - ref| / max |ref|, tolerance `CHECK_TOLERANCE`), so the op compared is the
same.

Their sources (read from RobertCsordas/moe_layer, RobertCsordas/cvmm_codex and
shawntan/scattermoe; nothing of theirs is in this repository):
- moe_layer (the original CVMM, triton_src/moe_layer/cvmm.py; Triton, no CUDA extension
  build (its cuda_src/ variant compiles one; not used); its requirements.txt pins torch 2.1.0
  and triton 2.1.0): `cvmm(x, sel, keys)` with keys [E, M, L]
  (our layout). `cvmm_prepare_sel2(sel_int32)` sorts the flattened [T, K] ids and keeps
  `sel_index` (sorted slot // K: the token row read) and `out_index` (the slot written); for
  the gated down projection its layer clones that, sets `reduction_weight` = gates [T, K],
  `sel_index` = `out_index` and `out_index` = None, and passes h [T, K, G]. Its kernels
  compute in float16 unless the output is float32 (float16 outputs under autocast, else
  x's dtype); its weight gradient is atomics into a buffer of the weights' dtype. Its import
  registers `mylib::cvmm_triton` and puts `@torch.library.impl_abstract(name, cvmm_triton)`
  over its fake function: where that call registers `cvmm_triton` and returns it (newer
  torch), the decorator line would call `cvmm_triton` on the fake function. While importing
  it, the worker makes that decorator register the decorated function with
  `torch.library.register_fake` (a shim recorded in the JSON; only torch.compile uses fake
  functions).
- cvmm_codex (cvmm.py, one file; Triton and `packaging`; its kernels and the op
  `mylib::cvmm_triton` (`torch.library.define`, `register_fake` on Triton >= 3) are made on
  the first call; it calls `torch.get_autocast_gpu_dtype`, shimmed from
  `torch.get_autocast_dtype("cuda")` where missing): `cvmm(x, sel, keys)`, keys
  [E, M, L]; `cvmm_prepare_sel2(sel, weights=None, route_input=False)`: up with x [..., M]
  shared, down with `route_input=True`, x [..., K, M] and `weights` = gates. Its output
  dtype is autocast's (float32 without autocast), so it runs under
  `torch.autocast("cuda", bfloat16)`, as its benchmark does (benchmark_moe_shapes.py: bf16
  activations, float32 weights and gates, B 8 x T 2048, K 8, N_E 512).
- scattermoe (the `scattermoe` package; Triton, `torch.library.custom_op`s, needs torch >=
  2.4): `parallel_linear(x, expert_weights [E, M, L], k, sorted_expert_idxs,
  sorted_scattered_idxs, expert_offsets, gates=None, grouped_in=False, grouped_out=False)`;
  the three index arrays are `flatten_sort_count(sel, E)` (sort of the flattened ids, and the
  cumulative counts per expert), which it wraps in torch.compile: the worker computes the same
  three in eager torch. Up: x [T, d] with k=K, output [T*K, G] in slot order; down: h as
  [T*K, G] rows with k=1 and gates [T, K], output [T, d]. Weights and gates in x's dtype.
Weights and gates are float32 for moe_layer and cvmm_codex (their layers' parameters and
cvmm_codex's benchmark) and bfloat16 for scattermoe, the torch probe and ours
(`--theirs_weight_dtype=bfloat16` gives every one bfloat16), all holding the same bfloat16
values.

The carry directory (`--stage_theirs=DIR`, git-ignored `third_party/` by default) holds
DIR/moe_layer/{LICENSE,README.md,triton_src/moe_layer/}, DIR/cvmm_codex/{README.md,cvmm.py},
DIR/scattermoe/{LICENSE,README.md,scattermoe/} and DIR/SOURCES.json (repository and commit of
each), extracted with `git archive` from the mirrors under `--mirrors` (each
`OWNER+NAME/repo`, a git directory); about 250 KB. On a lent GPU machine (PyTorch and Triton
installed, no network), the `run` tool with `carry: ["third_party"]` and

    python -m benchmarks.cvmm_side_by_side --theirs=third_party --budget_s=300 \
        --output=$OUT/cvmm_side_by_side.json

Time budget: `--budget_s` from the start; ours stops starting cells at `--ours_share` of it
(all of it when no side of theirs can run), then each worker of theirs gets an equal part of
what is left (the torch probe half a part), stops starting cells at its end and is
killed `WORKER_GRACE_S` later (what it wrote stays); cells not run read "skipped: time
budget". A cell already started runs to its end, so the whole can pass the budget by about
one cell and the grace. Prints a Markdown table and writes JSON (`machine.write_result`).
"""

import argparse
import contextlib
import importlib.util
import json
import math
import os
import pathlib
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import traceback

import ml_dtypes
import numpy as np

REPO = pathlib.Path(__file__).resolve().parents[1]
OPS = ("up", "down")
PASSES = ("fwd", "fwd_bwd")
THEIRS = ("moe_layer", "cvmm_codex", "scattermoe")
WORKERS = ("probe_torch", *THEIRS)  # in the order they run
# What --stage_theirs extracts from each mirror: (owner/name, paths in the repository).
SOURCES = {
    "moe_layer": ("RobertCsordas/moe_layer", ("LICENSE", "README.md", "triton_src/moe_layer")),
    "cvmm_codex": ("RobertCsordas/cvmm_codex", ("README.md", "cvmm.py")),
    "scattermoe": ("shawntan/scattermoe", ("LICENSE", "README.md", "scattermoe")),
}
# Where each one's sources are put on sys.path, inside DIR/<name>.
IMPORT_ROOTS = {"moe_layer": "triton_src", "cvmm_codex": ".", "scattermoe": "."}
# Weights and gates dtype of each torch side by default (see the docstring).
NATIVE_WEIGHT_DTYPE = {"moe_layer": "float32", "cvmm_codex": "float32",
                       "scattermoe": "bfloat16", "probe_torch": "bfloat16"}
# Forward + backward time over the probe's that our kernels aim for (issue 59).
GOALS = {"up": 1.3, "down": 1.05}
CHECK_TOLERANCE = 2e-2  # max |a - ref| / max |ref| for bfloat16 outputs and gradients
WORKER_GRACE_S = 30.0
PROBE_WORKER_WEIGHT = 0.5  # the torch probe's part of the workers' time, against 1 each
DEFAULT_MIRRORS = "/work/.mirror"
PROBE_DEFINITION = (
    "cvmm_codex README: 'a single shared dense weight with pre-materialized route-shaped input "
    "and the same number of route matmuls'; here up = [T*K, d] rows @ W [d, G], down = "
    "[T*K, G] rows @ W [G, d] then gates applied and the K slots summed (elementwise)")


# Inputs, identical on both sides.

def _bf16_values(a: np.ndarray) -> np.ndarray:
  """float32 holding bfloat16 values (round to nearest even, as both frameworks convert)."""
  return a.astype(np.float32).astype(ml_dtypes.bfloat16).astype(np.float32)


def _normal(rng, shape, scale=1.0) -> np.ndarray:
  return _bf16_values(rng.standard_normal(shape, dtype=np.float32) * np.float32(scale))


def token_inputs(seed: int, tokens: int, d_model: int, group: int, k: int) -> dict:
  """The arrays of a shape that do not depend on N_E: x, h and the cotangents."""
  rng = np.random.default_rng([seed, tokens, d_model, group, k])
  return {"x": _normal(rng, (tokens, d_model)), "h": _normal(rng, (tokens, k, group)),
          "ct_up": _normal(rng, (tokens, k, group)), "ct_down": _normal(rng, (tokens, d_model))}


def expert_inputs(seed: int, tokens: int, d_model: int, group: int, k: int,
                  experts: int) -> dict:
  """sel (k distinct experts per token, top-k of random scores), gates in (0, 1) and the
  weights w_up [E, d, G], w_down [E, G, d]."""
  rng = np.random.default_rng([seed, tokens, d_model, group, k, experts])
  scores = rng.random((tokens, experts), dtype=np.float32)
  sel = np.argpartition(-scores, k - 1, axis=1)[:, :k].astype(np.int64)
  return {"sel": sel, "gates": _bf16_values(rng.random((tokens, k), dtype=np.float32)),
          "w_up": _normal(rng, (experts, d_model, group), d_model ** -0.5),
          "w_down": _normal(rng, (experts, group, d_model), group ** -0.5)}


def make_inputs(seed: int, tokens: int, d_model: int, group: int, k: int,
                experts: int) -> dict:
  """Every array of one shape: `token_inputs` and `expert_inputs`."""
  return {**token_inputs(seed, tokens, d_model, group, k),
          **expert_inputs(seed, tokens, d_model, group, k, experts)}


def probe_inputs(seed: int, tokens: int, d_model: int, group: int, k: int) -> dict:
  """The probe's: route-shaped rows (xr [T*K, d], hr [T*K, G]), one weight per projection,
  the gates and the cotangents."""
  rng = np.random.default_rng([seed, tokens, d_model, group, k, 0])
  return {"xr": _normal(rng, (tokens * k, d_model)), "hr": _normal(rng, (tokens * k, group)),
          "w_up": _normal(rng, (d_model, group), d_model ** -0.5),
          "w_down": _normal(rng, (group, d_model), group ** -0.5),
          "gates": _bf16_values(rng.random((tokens, k), dtype=np.float32)),
          "ct_up": _normal(rng, (tokens * k, group)), "ct_down": _normal(rng, (tokens, d_model))}


def routed_flops(op: str, pass_: str, tokens: int, d_model: int, group: int, k: int) -> int:
  """2*T*K*M*L: every slot's row times its expert's [M, L] matrix; 3x with the backward."""
  del op  # M*L is d*G for both projections
  return 2 * tokens * k * d_model * group * (3 if pass_ == "fwd_bwd" else 1)


# The float64 reference (the correctness check).

def reference_up(x, sel, w, ct) -> dict:
  """y [T, K, G] = x[t] @ w[sel[t, k]] and the gradients of <y, ct>, in float64."""
  x, w, ct = (np.asarray(a, np.float64) for a in (x, w, ct))
  y, dx, dw = np.zeros(ct.shape), np.zeros(x.shape), np.zeros(w.shape)
  for e in range(w.shape[0]):
    t, j = np.nonzero(sel == e)  # a token picks an expert at most once
    y[t, j] = x[t] @ w[e]
    dx[t] += ct[t, j] @ w[e].T
    dw[e] = x[t].T @ ct[t, j]
  return {"y": y, "dx": dx, "dw": dw}


def reference_down(h, sel, gates, w, ct) -> dict:
  """y [T, d] = sum_k gates[t, k] h[t, k] @ w[sel[t, k]] and the gradients of <y, ct>."""
  h, gates, w, ct = (np.asarray(a, np.float64) for a in (h, gates, w, ct))
  y, dh, dg, dw = np.zeros(ct.shape), np.zeros(h.shape), np.zeros(gates.shape), np.zeros(w.shape)
  for e in range(w.shape[0]):
    t, j = np.nonzero(sel == e)
    g = gates[t, j][:, None]
    z = h[t, j] @ w[e]
    y[t] += g * z
    dh[t, j] = g * (ct[t] @ w[e].T)
    dg[t, j] = np.sum(z * ct[t], axis=-1)
    dw[e] = (g * h[t, j]).T @ ct[t]
  return {"y": y, "dh": dh, "dw": dw, "dgates": dg}


def check_errors(outputs: dict, reference: dict) -> dict:
  """max |a - ref| / max |ref| of each array."""
  return {name: float(np.max(np.abs(np.asarray(outputs[name], np.float64) - ref))
                      / max(np.max(np.abs(ref)), 1e-30))
          for name, ref in reference.items()}


def check_inputs(args) -> dict:
  """The small shape of the correctness check."""
  return make_inputs(args.seed, args.check_tokens, args.d_models[0], args.group, args.k,
                     args.check_experts)


def check_result(name: str, outputs: dict, inputs: dict) -> dict:
  """An impl's errors against the float64 reference on the check shape."""
  errors = {}
  for op in OPS:
    errors[op] = check_errors({key[len(op) + 1:]: value for key, value in outputs.items()
                               if key.startswith(op + "_")}, _reference(op, inputs))
  worst = max(max(e.values()) for e in errors.values())
  return {"impl": name, "status": "ok" if worst <= CHECK_TOLERANCE else
          f"error: max relative error {worst:.3g} > {CHECK_TOLERANCE}",
          "max_rel_err": errors, "tolerance": CHECK_TOLERANCE}


def _reference(op: str, inputs: dict) -> dict:
  if op == "up":
    return reference_up(inputs["x"], inputs["sel"], inputs["w_up"], inputs["ct_up"])
  return reference_down(inputs["h"], inputs["sel"], inputs["gates"], inputs["w_down"],
                        inputs["ct_down"])


# Matmul FLOPs of a JAX function, from its jaxpr.

def matmul_flops(fn, *args) -> int:
  """2 * (product of the batch, free and contracted sizes) summed over every dot_general of
  `fn`'s jaxpr, sub-jaxprs included."""
  import jax
  return _jaxpr_matmul_flops(jax.make_jaxpr(fn)(*args).jaxpr)


def _sub_jaxprs(value):
  if hasattr(value, "eqns"):
    yield value
  elif hasattr(value, "jaxpr") and hasattr(value.jaxpr, "eqns"):
    yield value.jaxpr
  elif isinstance(value, (tuple, list)):
    for item in value:
      yield from _sub_jaxprs(item)


def _jaxpr_matmul_flops(jaxpr) -> int:
  total = 0
  for eqn in jaxpr.eqns:
    if eqn.primitive.name == "dot_general":
      (lhs_contract, _), _ = eqn.params["dimension_numbers"]
      lhs = eqn.invars[0].aval.shape
      out = eqn.outvars[0].aval.shape
      # The output's size is the product of the batch and free sizes.
      total += 2 * math.prod(out) * math.prod(lhs[i] for i in lhs_contract)
    for value in eqn.params.values():
      for sub in _sub_jaxprs(value):
        total += _jaxpr_matmul_flops(sub)
  return total


# Our side (JAX).

def jax_functions():
  """Ours and the JAX probe: {(side, op): (fn, number of differentiable leading args)}."""
  import jax.numpy as jnp
  from benchmarks import cvmm as cvmm_benchmark
  from pallas_kernels import cvmm

  def up(x, w, sel, impl):
    return cvmm(x, sel, w, impl=impl)

  def down(h, w, gates, sel, impl):
    return cvmm(h, sel, w, gates, impl=impl)

  def probe_up(xr, w):
    return cvmm_benchmark.dense_projection(xr, w)

  def probe_down(hr, w, gates):
    tokens, k = gates.shape
    z = jnp.dot(hr, w, precision=cvmm_benchmark.full_precision(hr.dtype),
                preferred_element_type=jnp.float32).reshape(tokens, k, -1)
    return jnp.sum(gates.astype(jnp.float32)[:, :, None] * z, axis=1).astype(hr.dtype)

  return {("ours", "up"): (up, 2), ("ours", "down"): (down, 3),
          ("probe", "up"): (probe_up, 2), ("probe", "down"): (probe_down, 3)}


def jax_call(side: str, op: str, pass_: str, arrays: dict, impl: str):
  """The function and arguments of one cell (arrays already on the device)."""
  from benchmarks import cvmm as cvmm_benchmark
  fn, num_diff = jax_functions()[side, op]
  if side == "ours":
    args = ((arrays["x"], arrays["w_up"], arrays["sel"]) if op == "up" else
            (arrays["h"], arrays["w_down"], arrays["gates"], arrays["sel"]))
    call = lambda *a: fn(*a, impl=impl)  # noqa: E731
  else:
    args = ((arrays["xr"], arrays["w_up"]) if op == "up" else
            (arrays["hr"], arrays["w_down"], arrays["gates"]))
    call = fn
  if pass_ == "fwd":
    return call, args
  ct = arrays["ct_" + op]
  return cvmm_benchmark.forward_and_backward(call, tuple(range(num_diff))), (ct, *args)


def to_jax(arrays: dict, dtype: str) -> dict:
  """numpy inputs as JAX arrays: floats in `dtype`, sel as int32."""
  import jax.numpy as jnp
  return {name: jnp.asarray(a, jnp.int32 if name == "sel" else jnp.dtype(dtype))
          for name, a in arrays.items()}


def ours_check(args) -> dict:
  """Our impl's output and gradients on the check shape, against the float64 reference."""
  import jax
  inputs = check_inputs(args)
  arrays = to_jax(inputs, args.dtype)
  outputs = {}
  for op in OPS:
    fn, args_ = jax_call("ours", op, "fwd_bwd", arrays, args.impl)
    y, grads = jax.jit(fn)(*args_)
    names = ("dx", "dw") if op == "up" else ("dh", "dw", "dgates")
    outputs[op + "_y"] = np.asarray(y.astype("float32"))
    for name, grad in zip(names, grads):
      outputs[f"{op}_{name}"] = np.asarray(grad.astype("float32"))
  return check_result(f"ours ({args.impl})", outputs, inputs)


def new_row(args, impl: str, framework: str, op: str, pass_: str, d_model: int,
            experts: int | None, status: str = "ok") -> dict:
  return {"impl": impl, "framework": framework, "op": op, "pass": pass_,
          "tokens": args.tokens, "d_model": d_model, "group": args.group, "k": args.k,
          "experts": experts, "dtype": args.dtype, "status": status,
          "routed_flops": routed_flops(op, pass_, args.tokens, d_model, args.group, args.k)}


def shapes(args) -> list[tuple[int, int]]:
  """(d_model, N_E) in the order they run: every d_model at the first N_E, then the next."""
  return [(d_model, experts) for experts in args.experts for d_model in args.d_models]


def compile_cell(row: dict, fn, fn_args, min_sample_ms: float):
  """`fn` compiled and run twice (the second call timed, to choose the calls per sample): the
  call to time, or None (the row then holds the error)."""
  import jax
  try:
    start = time.perf_counter()
    compiled = jax.jit(fn).lower(*fn_args).compile()
    row["compile_s"] = time.perf_counter() - start
    jax.block_until_ready(compiled(*fn_args))
    start = time.perf_counter()
    jax.block_until_ready(compiled(*fn_args))
    call_ms = (time.perf_counter() - start) * 1e3
  except Exception as error:  # A cell's failure is its result; the others go on.
    row.update(status="error", error=_error_text(error))
    return None
  row["calls_per_sample"] = max(1, math.ceil(min_sample_ms / max(call_ms, 1e-3)))
  from benchmarks import cvmm as cvmm_benchmark
  return cvmm_benchmark.repeated_call(compiled, row["calls_per_sample"])


def ours_rows(args, clock) -> list[dict]:
  """Our impl and the JAX probe at every shape while ours' share of the budget lasts: per
  (d_model, N_E), our cells and the probe's of that d_model (compiled once per d_model, its
  rows repeated per N_E) timed together in interleaved rounds (benchmarks/cvmm.py), so each
  ratio to the probe is measured under the same load."""
  from benchmarks import cvmm as cvmm_benchmark
  rows, probe_arrays, probe_calls = [], {}, {}
  for d_model, experts in shapes(args):
    cells = [(new_row(args, "probe", "jax", op, p, d_model, experts), "probe")
             for op in OPS for p in PASSES]
    cells += [(new_row(args, args.impl, "jax", op, p, d_model, experts), "ours")
              for op in OPS for p in PASSES]
    calls, arrays = {}, None
    for row, side in cells:
      rows.append(row)
      if clock.ours_left() <= 0:
        row["status"] = "skipped: time budget"
        continue
      if side == "probe":
        if d_model not in probe_arrays:
          probe_arrays[d_model] = to_jax(
              probe_inputs(args.seed, args.tokens, d_model, args.group, args.k), args.dtype)
        arrays_of_side = probe_arrays[d_model]
      else:
        if arrays is None:
          arrays = to_jax(make_inputs(args.seed, args.tokens, d_model, args.group, args.k,
                                      experts), args.dtype)
        arrays_of_side = arrays
      key = (d_model, row["op"], row["pass"])
      if side == "probe" and key in probe_calls:
        call, fn_args, fields = probe_calls[key]
        row.update(fields)
      else:
        print(f"[side_by_side {clock.elapsed():6.1f} s] jax {row['impl']} d={d_model} "
              f"N_E={experts} {row['op']} {row['pass']}", file=sys.stderr, flush=True)
        fn, fn_args = jax_call(side, row["op"], row["pass"], arrays_of_side, args.impl)
        if side == "probe":
          row["matmul_flops"] = matmul_flops(fn, *fn_args)
        call = compile_cell(row, fn, fn_args, args.min_sample_ms)
        if side == "probe":
          fields = {k: row[k] for k in ("status", "error", "matmul_flops", "compile_s",
                                        "calls_per_sample") if k in row}
          probe_calls[key] = (call, fn_args, fields)
      if call is not None:
        calls[len(rows) - 1] = (call, fn_args)
    cvmm_benchmark.time_rows(rows, calls, args.repeats)
  return rows


def _error_text(error: BaseException, limit: int = 1500) -> str:
  text = f"{type(error).__name__}: {error}"
  return text if len(text) <= limit else text[:limit] + " ..."


# Their side (PyTorch), in subprocesses.

def theirs_skip_reason(name: str, theirs: str | None) -> str | None:
  """Why a torch side cannot run here (None: start its worker)."""
  if name != "probe_torch":
    if not theirs:
      return "skipped: no --theirs directory given"
    source = pathlib.Path(theirs) / name
    if not source.is_dir():
      return (f"skipped: {source} not found (stage it with python -m "
              f"benchmarks.cvmm_side_by_side --stage_theirs={theirs})")
  if importlib.util.find_spec("torch") is None:
    return "skipped: torch is not installed"
  if name != "probe_torch" and importlib.util.find_spec("triton") is None:
    return "skipped: triton is not installed"
  return None


def torch_cells(args, name: str) -> list[dict]:
  """The rows a torch side times, in order: the probe per d_model, the others per shape."""
  order = ([(d, None) for d in args.d_models] if name == "probe_torch" else shapes(args))
  return [new_row(args, name, "torch", op, p, d, e)
          for d, e in order for op in OPS for p in PASSES]


def run_worker(args, name: str, seconds: float, log_dir: pathlib.Path) -> dict:
  """Runs one torch side in a subprocess for about `seconds`: {"rows", "check", "status", ...}
  (its rows as far as it got; the rest "skipped: ...")."""
  spec_path = log_dir / f"{name}_spec.json"
  result_path = log_dir / f"{name}_result.json"
  log_path = log_dir / f"{name}.log"
  check = None
  if name != "probe_torch":
    check = {"inputs": str(log_dir / "check_inputs.npz"),
             "outputs": str(log_dir / f"{name}_check.npz")}
  spec = {"name": name, "theirs": str(pathlib.Path(args.theirs).resolve()) if args.theirs else None,
          "deadline_s": seconds, "result": str(result_path), "check": check,
          "cells": torch_cells(args, name), "seed": args.seed, "repeats": args.repeats,
          "min_sample_ms": args.min_sample_ms,
          "weight_dtype": (args.theirs_weight_dtype
                           if args.theirs_weight_dtype != "native" and name != "probe_torch"
                           else NATIVE_WEIGHT_DTYPE[name])}
  spec_path.write_text(json.dumps(spec))
  env = dict(os.environ)
  env.setdefault("TRITON_CACHE_AUTOTUNING", "1")  # a rerun on a warm machine skips autotuning
  start = time.perf_counter()
  with open(log_path, "w") as log:
    process = subprocess.Popen(
        [sys.executable, "-m", "benchmarks.cvmm_side_by_side", f"--_worker={spec_path}"],
        cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
      returncode = process.wait(timeout=seconds + WORKER_GRACE_S)
    except subprocess.TimeoutExpired:
      process.kill()
      process.wait()
      returncode = None
  try:
    result = json.loads(result_path.read_text())
  except (OSError, ValueError):
    result = {}
  done = {(r["d_model"], r["experts"], r["op"], r["pass"]): r for r in result.get("rows", [])}
  status = result.get("status")
  if returncode is None:
    status = f"skipped: time budget (worker killed after {seconds + WORKER_GRACE_S:.0f} s)"
  elif returncode != 0 and status in (None, "ok"):
    status = f"error: worker exited with {returncode} (see log_tail)"
  elif status is None:
    status = "error: the worker wrote no result (see log_tail)"
  rows = []
  for cell in spec["cells"]:
    row = done.get((cell["d_model"], cell["experts"], cell["op"], cell["pass"]))
    rows.append(row or {**cell, "status": "skipped: time budget" if status == "ok" else status})
  for row in rows:
    row["weight_dtype"] = spec["weight_dtype"]
  summary = {**{key: value for key, value in result.items() if key not in ("rows", "name")},
             "status": status, "elapsed_s": time.perf_counter() - start,
             "returncode": returncode, "log_tail": _tail(log_path)}
  return {"rows": rows, "summary": summary,
          "check_outputs": check["outputs"] if check and pathlib.Path(check["outputs"]).exists()
          else None, "check_status": result.get("check_status")}


def _tail(path: pathlib.Path, chars: int = 3000) -> str:
  text = path.read_text(errors="replace") if path.exists() else ""
  return text[-chars:]


def theirs_rows(args, clock, log_dir: pathlib.Path, check_arrays: dict | None):
  """Every torch side's rows, the workers' summaries and their correctness checks."""
  rows, workers, checks = [], {}, []
  reasons = {name: theirs_skip_reason(name, args.theirs) for name in WORKERS}
  runnable = [name for name in WORKERS if reasons[name] is None]
  if check_arrays is not None and runnable:
    np.savez(log_dir / "check_inputs.npz", **check_arrays)
  for name in WORKERS:
    if reasons[name] is not None:
      rows += [{**cell, "status": reasons[name]} for cell in torch_cells(args, name)]
      workers[name] = {"status": reasons[name]}
      if name != "probe_torch":
        checks.append({"impl": name, "status": reasons[name]})
      continue
    left = runnable[runnable.index(name):]
    weights = [PROBE_WORKER_WEIGHT if n == "probe_torch" else 1.0 for n in left]
    seconds = max(clock.left(), 0.0) * weights[0] / sum(weights)
    if seconds <= 0:
      rows += [{**cell, "status": "skipped: time budget"} for cell in torch_cells(args, name)]
      workers[name] = {"status": "skipped: time budget"}
      continue
    print(f"[side_by_side {clock.elapsed():6.1f} s] torch {name} for {seconds:.0f} s",
          file=sys.stderr, flush=True)
    outcome = run_worker(args, name, seconds, log_dir)
    rows += outcome["rows"]
    workers[name] = outcome["summary"]
    if name != "probe_torch":
      if outcome["check_outputs"]:
        with np.load(outcome["check_outputs"]) as outputs:
          checks.append(check_result(name, dict(outputs), check_arrays))
      else:
        checks.append({"impl": name, "status": outcome["check_status"]
                       or outcome["summary"]["status"]})
  return rows, workers, checks


# The worker (runs in its own process, imports torch and one side's sources).

def worker_main(spec_path: str) -> None:
  spec = json.loads(pathlib.Path(spec_path).read_text())
  result = {"name": spec["name"], "status": "ok", "rows": [], "shims": []}

  def save():  # whole or not at all: the parent may kill this process at any time
    partial = spec["result"] + ".partial"
    pathlib.Path(partial).write_text(json.dumps(result, indent=1))
    os.replace(partial, spec["result"])

  start = time.perf_counter()
  try:
    import torch
  except ImportError as error:
    result["status"] = f"skipped: torch is not installed ({error})"
    return save()
  if not torch.cuda.is_available():
    result["status"] = "skipped: torch sees no CUDA device"
    return save()
  result["versions"] = {"torch": torch.__version__, "device": torch.cuda.get_device_name()}
  try:
    side = TorchSide(spec, torch, result["shims"])
  except Exception as error:
    result["status"] = f"error: importing {spec['name']}: {_error_text(error)}"
    result["traceback"] = traceback.format_exc()[-4000:]
    return save()
  result["versions"].update(side.versions)
  save()
  if spec["check"]:
    try:
      with np.load(spec["check"]["inputs"]) as inputs:
        np.savez(spec["check"]["outputs"], **side.check(dict(inputs)))
      result["check_status"] = "ran"
    except Exception as error:
      result["check_status"] = f"error: {_error_text(error)}"
      result["check_traceback"] = traceback.format_exc()[-4000:]
    save()
  shape_cache = {}
  for cell in spec["cells"]:
    if time.perf_counter() - start > spec["deadline_s"]:
      break
    print(f"{spec['name']}: d={cell['d_model']} N_E={cell['experts']} {cell['op']} "
          f"{cell['pass']}", flush=True)
    row = dict(cell)
    try:
      key = (cell["d_model"], cell["experts"])
      if key not in shape_cache:
        shape_cache.clear()
        torch.cuda.empty_cache()
        shape_cache[key] = side.shape_arrays(cell)
      row.update(side.time_cell(cell, shape_cache[key], spec["repeats"],
                                spec["min_sample_ms"]))
    except Exception as error:  # A cell's failure is its result.
      row.update(status="error", error=_error_text(error))
      if "out of memory" in str(error).lower():
        shape_cache.clear()
    result["rows"].append(row)
    save()
  if len(result["rows"]) < len(spec["cells"]):
    result["status"] = "skipped: time budget"
  save()


class TorchSide:
  """One torch side: its module, its inputs as torch tensors, and its two ops."""

  def __init__(self, spec: dict, torch, shims: list):
    self.torch, self.name, self.spec = torch, spec["name"], spec
    self.weight_dtype = getattr(torch, spec["weight_dtype"])
    self.versions = {}
    if self.name != "probe_torch":
      import triton
      self.versions["triton"] = triton.__version__
      sys.path.insert(0, str(pathlib.Path(spec["theirs"]) / self.name
                             / IMPORT_ROOTS[self.name]))
    if self.name == "moe_layer":
      with _impl_abstract_as_decorator(torch, shims):
        module = importlib.import_module("moe_layer.cvmm")
    elif self.name == "cvmm_codex":
      if not hasattr(torch, "get_autocast_gpu_dtype"):
        torch.get_autocast_gpu_dtype = lambda: torch.get_autocast_dtype("cuda")
        shims.append("torch.get_autocast_gpu_dtype = get_autocast_dtype('cuda')")
      module = importlib.import_module("cvmm")
    elif self.name == "scattermoe":
      module = importlib.import_module("scattermoe.parallel_experts")
    else:
      module = None
    self.module = module

  def tensor(self, a: np.ndarray, dtype, grad: bool = False):
    t = self.torch.from_numpy(np.ascontiguousarray(a)).to("cuda").to(dtype)
    return t.requires_grad_(grad)

  def shape_arrays(self, cell: dict) -> dict:
    """One shape's inputs as tensors (weights and gates in the side's weight dtype)."""
    spec = self.spec
    args = (spec["seed"], cell["tokens"], cell["d_model"], cell["group"], cell["k"])
    arrays = (probe_inputs(*args) if self.name == "probe_torch" else
              make_inputs(*args, cell["experts"]))
    return self.tensors(arrays)

  def tensors(self, arrays: dict) -> dict:
    torch = self.torch
    out = {}
    for name, a in arrays.items():
      if name == "sel":
        out[name] = torch.from_numpy(a).to("cuda").long()
      elif name.startswith("ct_"):
        out[name] = self.tensor(a, torch.bfloat16)
      elif name.startswith("w_") or name == "gates":
        out[name] = self.tensor(a, self.weight_dtype, grad=True)
      else:
        out[name] = self.tensor(a, torch.bfloat16, grad=True)
    return out

  def leaves(self, op: str, t: dict) -> list:
    if self.name == "probe_torch":
      return [t["xr"], t["w_up"]] if op == "up" else [t["hr"], t["w_down"], t["gates"]]
    return [t["x"], t["w_up"]] if op == "up" else [t["h"], t["w_down"], t["gates"]]

  def prepare(self, op: str, t: dict):
    """The side's selection preprocessing (timed apart, as `prep_ms`)."""
    m, torch = self.module, self.torch
    if self.name == "probe_torch":
      return None
    sel = t["sel"]
    if self.name == "moe_layer":
      prep = m.cvmm_prepare_sel2(sel.int())
      if op == "down":  # as its MoE layer prepares the down projection
        prep = prep.clone()
        prep.reduction_weight = t["gates"]
        prep.sel_index = prep.out_index
        prep.out_index = None
      return prep
    if self.name == "cvmm_codex":
      if op == "up":
        return m.cvmm_prepare_sel2(sel, None, route_input=False)
      return m.cvmm_prepare_sel2(sel, t["gates"], route_input=True)
    # scattermoe: flatten_sort_count without its torch.compile wrapper.
    flat = sel.flatten()
    sorted_expert_idxs, sorted_scattered_idxs = torch.sort(flat)
    expert_offsets = flat.bincount(minlength=t["w_up"].shape[0]).cumsum(-1)
    return sorted_expert_idxs, sorted_scattered_idxs, expert_offsets

  def forward(self, op: str, t: dict, prep):
    """The op's output: [T, K, G] for up, [T, d] for down."""
    m, torch = self.module, self.torch
    tokens, k = t["gates"].shape
    if self.name == "probe_torch":
      if op == "up":
        return t["xr"] @ t["w_up"]
      z = (t["hr"] @ t["w_down"]).view(tokens, k, -1)
      return (z.float() * t["gates"].float()[:, :, None]).sum(1).to(z.dtype)
    if self.name == "moe_layer":
      return (m.cvmm(t["x"], prep, t["w_up"]) if op == "up" else
              m.cvmm(t["h"], prep, t["w_down"]))
    if self.name == "cvmm_codex":
      with torch.autocast("cuda", dtype=torch.bfloat16):
        return (m.cvmm(t["x"], prep, t["w_up"]) if op == "up" else
                m.cvmm(t["h"], prep, t["w_down"]))
    if op == "up":
      y = m.parallel_linear(t["x"], t["w_up"], k, *prep)
      return y.view(tokens, k, -1)
    return m.parallel_linear(t["h"].reshape(tokens * k, -1), t["w_down"], 1, *prep,
                             gates=t["gates"])

  def step(self, op: str, t: dict, prep, pass_: str):
    """One call of a pass: the forward (no autograd), or forward + backward of <y, ct>."""
    if pass_ == "fwd":
      with self.torch.no_grad():
        return self.forward(op, t, prep)
    for leaf in self.leaves(op, t):
      leaf.grad = None
    y = self.forward(op, t, prep)
    y.backward(t["ct_" + op].view(y.shape))
    return y

  def time_cell(self, cell: dict, t: dict, repeats: int, min_sample_ms: float) -> dict:
    op, pass_ = cell["op"], cell["pass"]
    prep = self.prepare(op, t)
    ms, calls = time_torch(self.torch, lambda: self.step(op, t, prep, pass_), repeats,
                           min_sample_ms)
    out = {"status": "ok", "ms": ms, "calls_per_sample": calls}
    if self.name != "probe_torch":
      out["prep_ms"], _ = time_torch(self.torch, lambda: self.prepare(op, t), repeats,
                                     min_sample_ms)
    return out

  def check(self, inputs: dict) -> dict:
    """Output and gradients of both ops on the check shape, as float32 numpy arrays."""
    t = self.tensors(inputs)
    out = {}
    for op in OPS:
      y = self.step(op, t, self.prepare(op, t), "fwd_bwd")
      names = ("dx", "dw") if op == "up" else ("dh", "dw", "dgates")
      out[op + "_y"] = y.detach().float().cpu().numpy()
      for name, leaf in zip(names, self.leaves(op, t)):
        out[f"{op}_{name}"] = leaf.grad.float().cpu().numpy()
    return out


def time_torch(torch, fn, repeats: int, min_sample_ms: float) -> tuple[float, int]:
  """Median ms of `fn` on the GPU (torch.cuda.Event) after two warm-up calls; one sample is as
  many calls as last `min_sample_ms`."""
  fn()
  fn()
  torch.cuda.synchronize()
  start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
  start.record()
  fn()
  end.record()
  end.synchronize()
  calls = max(1, math.ceil(min_sample_ms / max(start.elapsed_time(end), 1e-3)))
  samples = []
  for _ in range(repeats):
    start.record()
    for _ in range(calls):
      fn()
    end.record()
    end.synchronize()
    samples.append(start.elapsed_time(end) / calls)
  return statistics.median(samples), calls


@contextlib.contextmanager
def _impl_abstract_as_decorator(torch, shims: list):
  """While moe_layer's cvmm.py is imported: `torch.library.impl_abstract(name, impl)` used as
  a decorator registers the decorated function as the op's fake (what it meant on torch 2.1;
  newer torch would call `impl` on the decorated function). Eager runs never use it."""
  library = torch.library
  register = getattr(library, "register_fake", None)
  if register is None:
    yield
    return
  original = getattr(library, "impl_abstract", None)

  def impl_abstract(qualname, func=None, *, lib=None, _stacklevel=1):
    def decorate(fake):
      try:
        register(qualname, fake, lib=lib)
      except Exception as error:  # Only torch.compile needs the fake; eager runs go on.
        shims.append(f"register_fake({qualname}) failed: {_error_text(error, 300)}")
      return fake
    return decorate

  library.impl_abstract = impl_abstract
  shims.append("torch.library.impl_abstract(name, impl) -> register_fake(name, decorated)")
  try:
    yield
  finally:
    if original is None:
      del library.impl_abstract
    else:
      library.impl_abstract = original


# Staging their sources.

def mirror_git_dir(mirrors: pathlib.Path, repo: str) -> pathlib.Path:
  """The git directory of `owner/name` under `mirrors`: OWNER+NAME/repo, OWNER+NAME/.git or
  OWNER+NAME itself."""
  root = mirrors / repo.replace("/", "+")
  for candidate in (root / "repo", root / ".git", root):
    if (candidate / "HEAD").is_file():
      return candidate
  raise FileNotFoundError(f"no git directory for {repo} under {mirrors} (fetch it first)")


def stage_theirs(dest: str, mirrors: str = DEFAULT_MIRRORS) -> dict:
  """Extracts SOURCES' files at each mirror's HEAD into dest/<name> (replacing what was
  there) and writes dest/SOURCES.json; returns it."""
  dest_dir = pathlib.Path(dest)
  dest_dir.mkdir(parents=True, exist_ok=True)
  sources = {}
  for name, (repo, paths) in SOURCES.items():
    git_dir = mirror_git_dir(pathlib.Path(mirrors), repo)
    git = ["git", f"--git-dir={git_dir}"]
    commit = subprocess.run([*git, "rev-parse", "HEAD"], check=True, capture_output=True,
                            text=True).stdout.strip()
    archive = subprocess.run([*git, "archive", "--format=tar", commit, *paths], check=True,
                             capture_output=True).stdout
    target = dest_dir / name
    shutil.rmtree(target, ignore_errors=True)
    target.mkdir()
    subprocess.run(["tar", "-x", "-C", str(target)], input=archive, check=True)
    sources[name] = {"repo": repo, "commit": commit, "paths": list(paths)}
  (dest_dir / "SOURCES.json").write_text(json.dumps(sources, indent=1))
  return sources


def read_sources(theirs: str | None) -> dict | None:
  if not theirs:
    return None
  path = pathlib.Path(theirs) / "SOURCES.json"
  return json.loads(path.read_text()) if path.exists() else None


# The run.

class Clock:
  """Seconds since the start; ours' share of the budget, then the rest."""

  def __init__(self, budget_s: float, ours_share: float):
    self.start, self.budget_s, self.ours_share = time.perf_counter(), budget_s, ours_share

  def elapsed(self) -> float:
    return time.perf_counter() - self.start

  def ours_left(self) -> float:
    return self.ours_share * self.budget_s - self.elapsed()

  def left(self) -> float:
    return self.budget_s - self.elapsed()


def derive(rows: list[dict]) -> None:
  """TFLOP/s of the routed work, time over the probe (own framework's and JAX's), goals."""
  probe = {(r["framework"], r["d_model"], r["experts"], r["op"], r["pass"]): r["ms"]
           for r in rows if r["impl"] in ("probe", "probe_torch") and r["status"] == "ok"}

  def probe_ms(framework, row):  # the probe timed with the row's shape, else its d_model's
    return probe.get((framework, row["d_model"], row["experts"], row["op"], row["pass"]),
                     probe.get((framework, row["d_model"], None, row["op"], row["pass"])))

  for row in rows:
    if row["status"] != "ok":
      continue
    row["tflops"] = row["routed_flops"] / (row["ms"] * 1e-3) / 1e12
    own, jax_probe = probe_ms(row["framework"], row), probe_ms("jax", row)
    row["x_probe"] = None if own is None else row["ms"] / own
    row["x_probe_jax"] = None if jax_probe is None else row["ms"] / jax_probe
    if row["framework"] == "jax" and row["impl"] != "probe" and row["pass"] == "fwd_bwd":
      row["goal_x_probe"] = GOALS[row["op"]]
      row["meets_goal"] = None if own is None else row["x_probe"] <= GOALS[row["op"]]


def run(args) -> dict:
  """Ours, then theirs, within the budget; the result as written to JSON."""
  from benchmarks import machine
  clock = Clock(args.budget_s, args.ours_share)
  reasons = {name: theirs_skip_reason(name, args.theirs) for name in WORKERS}
  if all(reason is not None for reason in reasons.values()):
    clock.ours_share = 1.0  # no side of theirs can run: ours takes the whole budget
  result = {"machine": machine.machine_info(), "settings": _settings(args),
            "probe_definition": PROBE_DEFINITION, "goals": GOALS,
            "sources": read_sources(args.theirs)}
  checks = []
  try:
    checks.append(ours_check(args))
  except Exception as error:
    checks.append({"impl": f"ours ({args.impl})", "status": f"error: {_error_text(error)}"})
  rows = ours_rows(args, clock)
  needs_check = any(reason is None for name, reason in reasons.items() if name != "probe_torch")
  with tempfile.TemporaryDirectory(prefix="cvmm_side_by_side_") as log_dir:
    their_rows, workers, their_checks = theirs_rows(
        args, clock, pathlib.Path(log_dir), check_inputs(args) if needs_check else None)
  rows += their_rows
  derive(rows)
  result.update(rows=rows, checks=checks + their_checks, workers=workers,
                elapsed_s=clock.elapsed())
  return result


def _settings(args) -> dict:
  return {key: value for key, value in vars(args).items()
          if key not in ("stage_theirs", "_worker")}


# The table.

TABLE_IMPLS = ("ours", "moe_layer", "cvmm_codex", "scattermoe")


def _cell_text(row: dict | None, ratio: str = "x_probe") -> str:
  if row is None:
    return "-"
  if row["status"] != "ok":
    return row["status"].split(":")[0]
  text = f"{row['ms']:.3f}"
  if row.get(ratio) is not None:
    text += f" ({row[ratio]:.2f}x)"
  return text


def format_table(result: dict) -> str:
  """Markdown: per op, d_model, N_E and pass, each side's ms and its time over its own
  framework's probe; then the correctness checks and the reasons for skipped rows."""
  rows = result["rows"]
  ours_impl = result["settings"]["impl"]
  by_key = {}
  for row in rows:
    impl = "ours" if row["framework"] == "jax" and row["impl"] == ours_impl else row["impl"]
    by_key[impl, row["op"], row["pass"], row["d_model"], row["experts"]] = row
  shapes = sorted({(r["op"], r["d_model"], r["experts"], r["pass"]) for r in rows
                   if r["experts"] is not None}, key=lambda s: (OPS.index(s[0]), -s[1], -s[2],
                                                                 PASSES.index(s[3])))
  lines = [f"T {rows[0]['tokens'] if rows else '-'}, G {result['settings']['group']}, "
           f"K {result['settings']['k']}, {result['settings']['dtype']}; ms (time over the "
           f"probe of the same framework); theirs' ms exclude their selection prep "
           f"(prep_ms in the JSON), ours include the sort", "",
           f"| op | d_model | N_E | pass | probe (JAX) | ours ({ours_impl}) | probe (torch) | "
           + " | ".join(TABLE_IMPLS[1:]) + " |",
           "|---|---:|---:|---|---:|---:|---:|" + "---:|" * (len(TABLE_IMPLS) - 1)]
  for op, d_model, experts, pass_ in shapes:
    cells = [_cell_text(by_key.get(("probe", op, pass_, d_model, experts)), "none"),
             _cell_text(by_key.get(("ours", op, pass_, d_model, experts))),
             _cell_text(by_key.get(("probe_torch", op, pass_, d_model, None)), "none")]
    cells += [_cell_text(by_key.get((impl, op, pass_, d_model, experts)))
              for impl in TABLE_IMPLS[1:]]
    lines.append(f"| {op} | {d_model} | {experts} | {pass_} | " + " | ".join(cells) + " |")
  lines += ["", "| check (float64 reference) | status | max rel. error |", "|---|---|---|"]
  for check in result.get("checks", []):
    errors = check.get("max_rel_err")
    worst = "-" if not errors else f"{max(max(e.values()) for e in errors.values()):.2e}"
    lines.append(f"| {check['impl']} | {check['status']} | {worst} |")
  reasons = {}
  for row in rows:
    if row["status"] != "ok":
      reasons.setdefault(row["impl"], set()).add(row.get("error") or row["status"])
  if reasons:
    lines += ["", "Not timed:"]
    lines += [f"- {impl}: {'; '.join(sorted(texts))}" for impl, texts in reasons.items()]
  return "\n".join(lines)


# Command line.

def _ints(text: str) -> list[int]:
  return [int(v) for v in text.split(",") if v]


def parse_args(argv):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--theirs", default=None,
                      help="directory of their staged sources (DIR/moe_layer, DIR/cvmm_codex, "
                           "DIR/scattermoe); without it only ours and the probes run")
  parser.add_argument("--stage_theirs", default=None, metavar="DIR",
                      help="extract their sources from --mirrors into DIR and exit")
  parser.add_argument("--mirrors", default=DEFAULT_MIRRORS,
                      help="folder of the fetched git mirrors (OWNER+NAME/repo)")
  parser.add_argument("--impl", default=None,
                      help="our cvmm impl (default pallas on a GPU, blocked elsewhere)")
  parser.add_argument("--tokens", type=int, default=None,
                      help="T (default 32768 on a GPU, 2048 elsewhere)")
  parser.add_argument("--d_models", default="1024,512", help="comma-separated d_model values")
  parser.add_argument("--experts", default="128,32,64,16", help="comma-separated N_E values")
  parser.add_argument("--group", type=int, default=128, help="G, units per expert")
  parser.add_argument("--k", type=int, default=4, help="K, experts per token")
  parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"],
                      help="our activations and weights (theirs: bfloat16 activations)")
  parser.add_argument("--theirs_weight_dtype", default="native",
                      choices=["native", "bfloat16", "float32"],
                      help="weights and gates of their kernels (native: see the docstring; "
                           "the torch probe keeps bfloat16)")
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--repeats", type=int, default=10, help="timed samples per cell")
  parser.add_argument("--min_sample_ms", type=float, default=2.0,
                      help="one timed sample is as many calls as last this long")
  parser.add_argument("--check_tokens", type=int, default=256,
                      help="T of the correctness check (d_model: the first of --d_models)")
  parser.add_argument("--check_experts", type=int, default=16, help="N_E of the check")
  parser.add_argument("--budget_s", type=float, default=300.0,
                      help="seconds from the start after which no cell starts")
  parser.add_argument("--ours_share", type=float, default=0.4,
                      help="fraction of --budget_s after which ours starts no cell")
  parser.add_argument("--output", default="cvmm_side_by_side.json", help="JSON results path")
  parser.add_argument("--_worker", default=None, help=argparse.SUPPRESS)
  args = parser.parse_args(argv)
  args.d_models, args.experts = _ints(args.d_models), _ints(args.experts)
  return args


def _complete(args) -> None:
  """Defaults that depend on the backend (resolved after parsing, so parsing needs no JAX)."""
  import jax
  on_gpu = jax.default_backend() == "gpu"
  args.impl = args.impl or ("pallas" if on_gpu else "blocked")
  args.tokens = args.tokens or (32768 if on_gpu else 2048)


def main(argv=None) -> dict | None:
  args = parse_args(argv)
  if args._worker:
    return worker_main(args._worker)
  if args.stage_theirs:
    sources = stage_theirs(args.stage_theirs, args.mirrors)
    for name, source in sources.items():
      print(f"{args.stage_theirs}/{name}: {source['repo']} at {source['commit']}")
    return sources
  _complete(args)
  result = run(args)
  print(format_table(result))
  write(result, args.output)
  return result


def write(result: dict, path: str) -> None:
  """The JSON, by `machine.write_result` (its folder made if needed)."""
  from benchmarks import machine
  pathlib.Path(path).parent.mkdir(parents=True, exist_ok=True)
  machine.write_result(result, path)


def suite_part(out_dir, budget_s: float, theirs: str | None = None, smoke: bool = False,
               argv: tuple[str, ...] = ()) -> dict:
  """For benchmarks/gpu_suite.py: runs within `budget_s`, writes
  out_dir/cvmm_side_by_side.json and returns its rows, checks and workers (smoke: tiny
  shapes, for the CPU)."""
  out = pathlib.Path(out_dir) / "cvmm_side_by_side.json"
  flags = [f"--budget_s={max(budget_s, 0.0)}", f"--output={out}", *argv]
  if theirs:
    flags.append(f"--theirs={theirs}")
  if smoke:
    flags += ["--tokens=64", "--d_models=32", "--experts=4", "--group=16", "--k=2",
              "--check_tokens=16", "--check_experts=4", "--repeats=2", "--min_sample_ms=0"]
  args = parse_args(flags)
  _complete(args)
  result = run(args)
  write(result, str(out))
  return {key: result[key] for key in ("settings", "rows", "checks", "workers", "sources")}


if __name__ == "__main__":
  main()
