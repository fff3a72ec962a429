"""Every GPU measurement in one command, meant to fit in 8 minutes on an H100 (GPU time is scarce).

    python -m benchmarks.gpu_suite --out DIR [--budget_s 420] [--blocked] [--parts=tests,training]
        [--tests=PATH,...] [--training=sigma_moe,xla_attention,switchhead,moeut,scan_layers,
                            scan_layers_moeut,aligned_widths,cudnn_attention,dropout_rng]
        [--parts=quality --quality_data=DIR [--quality="ARGS"]]
    python -m benchmarks.gpu_suite --smoke --out DIR     # tiny shapes on CPU: checks the suite

Parts, in order; each one's failure (and each cell's) is caught, recorded with its error text,
and the suite goes on:
  1. environment: device, jax/jaxlib/python versions, date, the device's peaks (`roofline`).
  2. tests: tests/pallas_kernels, tests/layers/test_moe_layers.py and the SwitchHead layer
     tests (`TEST_PATHS`, or --tests) on the GPU, in a subprocess (junit XML and log in DIR);
     skipped with --smoke (the CPU suite runs them).
  3. cvmm: one cvmm (the up projection: x [T, d] shared by K slots, w [N_E, d, G]) and the
     whole MoE layer (benchmarks/cvmm.py's `moe_layer`), forward and forward + backward, per
     impl of `pallas_kernels.IMPLS` (blocked with --blocked) and the parameter-matched dense
     matmul / MLP (d_ff = G * N_E): ms, TFLOP/s of the active work, the roofline bound and the
     fraction of it achieved, time relative to dense, and peak memory (the sigma-MoE paper's
     Fig. 2: time and memory against N_E).
  4. training: one training step of each model of `TRAINING`'s comparisons (or --training):
     sparse_jax/configs/sigma_moe_paper.py:wt103_s and its dense baseline (the fused XL attention, the
     default on one GPU), the same two with the XLA attention (`model.attention_impl=xla`),
     the SwitchHead paper's WT-103 S trio, MoEUT 44M and its dense baseline, and dense,
     sigma-MoE and MoEUT with their layers scanned (`model.scan_layers`), dense and sigma-MoE
     at widths of whole 16-byte rows (`ALIGNED_WIDTHS`), MoEUT on cuDNN, dense with its
     dropout masks from XLA's RngBitGenerator (`train.rng_impl`); bfloat16
     compute, f32 parameters, on random tokens (no dataset is prepared): ms/step, tokens/s,
     against the comparison's baseline, MFU, compile seconds, peak memory.
  5. step_profile: where the training step's device time goes (`benchmarks.step_profile`) for
     the dense (also at aligned widths and with the XLA attention), sigma-MoE and SwitchHead
     WT-103 S models (`STEP_PROFILE`): a few traced steps, device ms per category (matmuls,
     attention, dropout and RNG, norms and elementwise, MoE, copies, optimizer, other), the
     top kernels, and the kernels' sum beside the measured step.
     It reuses the steps the training part compiled (seconds each, run even past the part's
     share); a model that part did not reach is compiled here only within the share.
  6. decode: benchmarks/decode.py at its defaults.
  7. side_by_side (only when --parts names it; give it a call of its own, about 7 minutes):
     benchmarks/cvmm_side_by_side.py, our cvmm projections against cvmm_codex's
     dense-equivalent probe and, with `--theirs=DIR` (their sources staged by
     `python -m benchmarks.cvmm_side_by_side --stage_theirs=third_party`), against the
     authors' original CVMM, cvmm_codex and ScatterMoE, on the same inputs.
  8. quality (only when --parts names it; a call of its own): training runs of
     `benchmarks.quality_small` (--quality: the 12 `quality_medium` runs by default),
     `QUALITY_JOBS` at a time on the one GPU, on corpora carried from the CPU machine
     (--quality_data) so that they are the ones its runs trained on; issue 61's 12 runs take
     some 2.5 hours each on the 2-core CPU. `--quality="--config=wt103_s_embedded
     --corpora=builtin"`: the sigma-MoE paper's WT-103 S pair, dense against sigma-MoE, 2000
     steps each (`sparse_jax/configs/wt103_s_embedded.py`; issue 60's comparison).
Writes DIR/gpu_suite.json and DIR/gpu_suite.md (Markdown tables for benchmarks/RESULTS.md)
after every part (a part left out of --parts reads "skipped: --parts"), so a run that is
killed keeps what it measured; prints the Markdown at the end and progress lines to stderr as
it goes.

Time budget: `--budget_s` seconds from the start, shared out by `PART_ENDS`: each part stops
starting new cells once its share has passed (cells not run read "skipped: time budget"), so
a slow part cannot starve the ones after it; time a part leaves unused goes to the next.
"""

import argparse
import contextlib
import dataclasses
import datetime
import importlib.util
import itertools
import json
import math
import os
import pathlib
import platform
import shlex
import signal
import statistics
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from unittest import mock
from xml.etree import ElementTree

import jax
import jax.numpy as jnp
import jaxlib
import numpy as np

from benchmarks import cvmm as cvmm_benchmark
from benchmarks import cvmm_side_by_side, decode, gpu_suite_tables, roofline, step_profile
from benchmarks.lm_train_step import LMTrainStep
from sparse_jax.configs import moeut_paper, sigma_moe_paper, switchhead_paper, wt103_s_dense
from pallas_kernels import IMPLS, cvmm
from sparse_jax import parallel
from sparse_jax.models.accounting import model_report

REPO = pathlib.Path(__file__).resolve().parents[1]
# When each part stops starting cells, as a fraction of --budget_s from the start. A cell
# started just before its part's end still runs; these shares are meant to leave the last
# training cell (compiling the 16-layer model) and decoding room in the minute between the
# default budget and 8 minutes (estimated: check the elapsed times of the first GPU run).
PART_ENDS = {"tests": 0.3, "cvmm": 0.65, "training": 0.85, "step_profile": 0.9, "decode": 1.0,
             "side_by_side": 1.0, "quality": 1.0}
TEST_PATHS = ("tests/pallas_kernels", "tests/layers/test_moe_layers.py",
              "tests/layers/test_switchhead_attention.py",
              "tests/layers/test_switchhead_xl_attention.py",
              "tests/layers/test_switchhead_authors.py")
PARTS = ("tests", "cvmm", "training", "step_profile", "decode", "side_by_side", "quality")
# (after "environment"); the default --parts leaves out the last two, each a call of its own.
DEFAULT_PARTS = PARTS[:-2]
# The quality part: `benchmarks.quality_small`'s arguments by default (--quality), and how many
# runs share the GPU at a time (small models: one alone leaves most of it idle).
QUALITY_ARGS = "--config=quality_medium --seeds=0,1,2,3,4,5 --corpora=builtin,prose"
SMOKE_QUALITY_ARGS = "--config=quality_small --variants=dense --seeds=0 --steps=2"
QUALITY_JOBS = 8
TESTS_TIMEOUT_S = 240
INTERRUPT_GRACE_S = 20  # for pytest to write its junit XML after a timeout's SIGINT
TEST_WORKERS = 4  # pytest-xdist processes sharing the GPU: test time is mostly compilation.
# A ragged cell whose estimated memory exceeds this fraction of the device's is not run.
MEMORY_FRACTION = 0.6
PASSES = ("fwd", "fwd_bwd")
NOT_TIMED = {"auto": "an alias", "gather": "the test oracle",
             "megablox": "TPU kernels: elsewhere Pallas interpret mode, far too slow to time"}


@dataclasses.dataclass(frozen=True)
class Scale:
  """The sizes of one mode of the suite. cvmm cells run in the order of
  product(dtypes, d_models, experts); each tuple is in order of importance, so the budget
  cuts the least important cells."""
  smoke: bool
  tokens: int
  group: int
  k: int
  dtypes: tuple[str, ...]
  d_models: tuple[int, ...]
  experts: tuple[int, ...]
  repeats: int  # timed samples per cvmm cell
  min_sample_ms: float  # a sample is as many calls as last this long (see `cvmm.repeated_call`)
  train_steps: int  # timed training steps, after one warm-up step
  profile_steps: int  # step_profile: timed steps, then as many traced ones (one warm-up)
  decode_argv: tuple[str, ...]


GPU = Scale(smoke=False, tokens=32768, group=128, k=4, dtypes=("bfloat16", "float32"),
            d_models=(1024, 512), experts=(128, 32, 64, 16), repeats=10, min_sample_ms=2.0,
            train_steps=5, profile_steps=3,
            decode_argv=())
SMOKE = Scale(smoke=True, tokens=64, group=16, k=2, dtypes=("float32", "bfloat16"),
              d_models=(32,), experts=(4,), repeats=2, min_sample_ms=0.0, train_steps=2,
              profile_steps=1,
              decode_argv=("--d_model=32", "--layers=1", "--context=4", "--repeats=2",
                           "--bandwidth_mib=4"))


class Budget:
  """The suite's clock: seconds since the start, and whether a part's share has passed."""

  def __init__(self, budget_s: float):
    self.start = time.perf_counter()
    self.budget_s = budget_s

  def elapsed(self) -> float:
    return time.perf_counter() - self.start

  def left(self, part: str) -> float:
    """Seconds until `part` must stop starting cells (<= 0: it has passed)."""
    return PART_ENDS[part] * self.budget_s - self.elapsed()


def progress(budget: Budget, message: str) -> None:
  print(f"[gpu_suite {budget.elapsed():6.1f} s] {message}", file=sys.stderr, flush=True)


def error_text(error: BaseException, limit: int = 2000) -> str:
  """The exception as `Type: message`, cut to `limit` characters (XLA's can be pages long)."""
  return f"{type(error).__name__}: {error}"[:limit]


def device_memory_limit() -> int | None:
  """Bytes the default device's allocator may use; None where it does not say (CPU)."""
  stats = jax.devices()[0].memory_stats()
  return stats.get("bytes_limit") if stats else None


# Part 1: environment.

def environment_part() -> dict:
  """The device, versions, date and the device's peaks (None if it is not in the table)."""
  device = jax.devices()[0]
  peaks = roofline.device_peaks(device.device_kind)
  return {"device_kind": device.device_kind, "platform": device.platform,
          "device_count": jax.device_count(), "memory_bytes_limit": device_memory_limit(),
          "jax": jax.__version__, "jaxlib": jaxlib.__version__,
          "python": platform.python_version(), "machine": platform.machine(),
          "date": datetime.datetime.now().isoformat(timespec="seconds"),
          "peaks": dataclasses.asdict(peaks) if peaks else None,
          "environment_info": jax.print_environment_info(return_string=True)}


# Part 2: the GPU tests.

def tests_part(scale: Scale, out_dir: pathlib.Path, budget: Budget,
               paths: list[str]) -> dict:
  """Runs the tests at `paths` (the kernel, MoE-layer and SwitchHead tests by default) in a
  subprocess; counts from its junit XML."""
  if scale.smoke:
    return {"status": "skipped: smoke"}
  timeout_s = min(TESTS_TIMEOUT_S, budget.left("tests"))
  if timeout_s <= 0:
    return {"status": "skipped: time budget"}
  xml, log = out_dir / "gpu_tests.xml", out_dir / "gpu_tests.log"
  command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *paths,
             f"--junitxml={xml}"]
  if importlib.util.find_spec("xdist"):
    command += ["-n", str(TEST_WORKERS)]
  progress(budget, f"tests: {' '.join(command[1:])} (timeout {timeout_s:.0f} s, log {log})")
  returncode = run_with_timeout(command, log, timeout_s)
  result = {"paths": list(paths), "command": " ".join(["python", *command[1:]]),
            "returncode": returncode}
  if returncode is None:
    result.update(status="error", error=f"timed out after {timeout_s:.0f} s, counts are of "
                                        f"the tests that finished; last output:\n{tail(log)}")
  if not xml.exists():
    return {**result, "status": "error",
            "error": f"pytest wrote no junit XML; last output:\n{tail(log)}"}
  return {**result, **junit_counts(xml)}


def run_with_timeout(command: list[str], log: pathlib.Path, timeout_s: float,
                     env: dict[str, str] | None = None) -> int | None:
  """Runs `command` in the repository with output to `log`; its exit code, or None if it
  ran out of time. Then its process group (xdist workers included) is interrupted, so that
  pytest still writes the junit XML of the tests that finished, and killed if it lingers.

  The children allocate GPU memory as they need it: this process already holds XLA's
  preallocated share of the device. `env` adds to (or overrides) their environment."""
  # tests/conftest.py runs the tests on the CPU unless JAX_PLATFORMS names the GPU.
  env = {**os.environ, "XLA_PYTHON_CLIENT_PREALLOCATE": "false", "JAX_PLATFORMS": "cuda,cpu",
         **(env or {})}
  with open(log, "w") as log_file:
    child = subprocess.Popen(command, cwd=REPO, env=env, stdout=log_file,
                             stderr=subprocess.STDOUT, start_new_session=True)
    try:
      return child.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
      os.killpg(child.pid, signal.SIGINT)
      try:
        child.wait(timeout=INTERRUPT_GRACE_S)
      except subprocess.TimeoutExpired:
        os.killpg(child.pid, signal.SIGKILL)
        child.wait()
      return None


def tail(path: pathlib.Path, lines: int = 20) -> str:
  return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


def junit_counts(xml: pathlib.Path) -> dict:
  """Passed, failed (failures and errors) and skipped test counts, and the failing ids.
  Unnamed test cases (what pytest-xdist writes for a test cut short) are not counted."""
  counts, failing = {"passed": 0, "failed": 0, "skipped": 0}, []
  for case in ElementTree.parse(xml).iter("testcase"):
    if case.get("name") is None:
      continue
    outcome = {child.tag for child in case} & {"failure", "error", "skipped"}
    if outcome & {"failure", "error"}:
      counts["failed"] += 1
      failing.append(f"{case.get('classname')}::{case.get('name')}")
    elif outcome:
      counts["skipped"] += 1
    else:
      counts["passed"] += 1
  return {**counts, "failing": failing}


# Part 3: cvmm and the MoE layer.

@dataclasses.dataclass(frozen=True)
class Workload:
  """One op of one impl at one shape: fn(*args), the first `num_diff` args differentiable,
  `ct` the cotangent of its output, `fwd_flops` its active forward FLOPs."""
  op: str
  impl: str
  fn: Callable
  args: tuple
  num_diff: int
  ct: jax.Array
  fwd_flops: int

  def call(self, pass_: str):
    """The function and arguments of the forward or forward + backward pass."""
    if pass_ == "fwd":
      return self.fn, self.args
    diff = tuple(range(self.num_diff))
    return cvmm_benchmark.forward_and_backward(self.fn, diff), (self.ct, *self.args)


def suite_impls(with_blocked: bool) -> list[str]:
  """The cvmm impls to time: those of IMPLS not in NOT_TIMED, and blocked if asked for."""
  return [impl for impl in IMPLS
          if impl not in NOT_TIMED and (with_blocked or impl != "blocked")]


def workloads(scale: Scale, dtype: str, d_model: int, experts: int,
              impls: list[str]) -> list[Workload]:
  """The cvmm and MoE-layer workloads of one shape, dense first in each op."""
  n, g, k = scale.tokens, scale.group, scale.k
  x_nd, sel_nk, gates_nk, w1_edg, w2_egd, ct_nd = cvmm_benchmark.random_layer(
      jax.random.key(experts), n, d_model, g, k, experts, jnp.dtype(dtype))
  w1_df, w2_fd = cvmm_benchmark.dense_weights(w1_edg, w2_egd)
  keys = jax.random.split(jax.random.key(d_model))
  ct_nkg = jax.random.normal(keys[0], (n, k, g), dtype)
  ct_nf = jax.random.normal(keys[1], (n, g * experts), dtype)
  up_flops, dense_flops = 2 * n * k * d_model * g, 2 * n * d_model * g * experts

  def up_projection(x, w, sel, impl):
    return cvmm(x, sel, w, impl=impl)

  def layer(x, w1, w2, gates, sel, impl):
    return cvmm_benchmark.moe_layer(x, sel, gates, w1, w2, impl)

  cvmm_ops = [Workload("cvmm", "dense", cvmm_benchmark.dense_projection, (x_nd, w1_df), 2,
                       ct_nf, dense_flops)]
  layer_ops = [Workload("moe_layer", "dense", cvmm_benchmark.dense_mlp, (x_nd, w1_df, w2_fd),
                        3, ct_nd, 2 * dense_flops)]
  for impl in impls:
    cvmm_ops.append(Workload("cvmm", impl, lambda *a, impl=impl: up_projection(*a, impl),
                             (x_nd, w1_edg, sel_nk), 2, ct_nkg, up_flops))
    layer_ops.append(Workload("moe_layer", impl, lambda *a, impl=impl: layer(*a, impl),
                              (x_nd, w1_edg, w2_egd, gates_nk, sel_nk), 4, ct_nd,
                              2 * up_flops))
  return cvmm_ops + layer_ops


def ragged_expansion_bytes(cell: dict) -> int:
  """XLA's default `ragged_dot` on GPUs is a dense dot over a masked copy of its input for
  every group: slots x N_E x width elements, twice live in the backward pass."""
  width = max(cell["d_model"], cell["group"])
  live = 2 if cell["pass"] == "fwd_bwd" else 1
  return (live * cell["tokens"] * cell["k"] * cell["experts"] * width
          * jnp.dtype(cell["dtype"]).itemsize)


def too_large(cell: dict, memory_limit: int | None) -> str | None:
  """Why a cell would not fit on the device (None: run it)."""
  if cell["impl"] != "ragged" or memory_limit is None:
    return None
  estimate = ragged_expansion_bytes(cell)
  if estimate <= MEMORY_FRACTION * memory_limit:
    return None
  return (f"needs ~{estimate / 2**30:.0f} GiB (ragged_dot's dense expansion) > "
          f"{MEMORY_FRACTION:.0%} of the device's {memory_limit / 2**30:.0f} GiB")


def compile_cell(cell: dict, workload: Workload, memory_limit: int | None,
                 min_sample_ms: float):
  """Compiles a cell and runs it twice (the second call timed, to choose the calls per
  sample); records its memory and bytes. The call to time and its arguments, or None (the
  cell then holds why)."""
  reason = too_large(cell, memory_limit)
  if reason:
    cell["status"] = f"skipped: {reason}"
    return None
  fn, args = workload.call(cell["pass"])
  start = time.perf_counter()
  try:
    compiled = jax.jit(fn).lower(*args).compile()
    cell["compile_s"] = time.perf_counter() - start
    cell["peak_memory_bytes"] = cvmm_benchmark.peak_memory_bytes(compiled)
    outputs = jax.block_until_ready(compiled(*args))
    start = time.perf_counter()
    jax.block_until_ready(compiled(*args))
    call_ms = (time.perf_counter() - start) * 1e3
  except Exception as error:  # A cell's failure is its result; the suite goes on.
    cell.update(status="error", error=error_text(error))
    return None
  cell["bytes"] = roofline.min_bytes(args, outputs)
  cell["calls_per_sample"] = max(1, math.ceil(min_sample_ms / call_ms))
  return cvmm_benchmark.repeated_call(compiled, cell["calls_per_sample"]), args


def derive(cells: list[dict], peaks: roofline.DevicePeaks | None) -> None:
  """TFLOP/s, the roofline bound and fraction, and time relative to dense of timed cells."""
  dense_ms = {(c["op"], c["pass"]): c["ms"] for c in cells
              if c["impl"] == "dense" and c["status"] == "ok"}
  for cell in cells:
    if cell["status"] != "ok":
      continue
    bound = roofline.bound_us(peaks, cell["dtype"], cell["flops"], cell["bytes"])
    dense = dense_ms.get((cell["op"], cell["pass"]))
    cell.update(tflops=roofline.tflops(cell["flops"], cell["ms"]), roofline_us=bound,
                roofline_fraction=None if bound is None else bound / (cell["ms"] * 1e3),
                x_dense=None if dense is None else dense / cell["ms"])


def new_cell(scale: Scale, dtype: str, d_model: int, experts: int, op: str, impl: str,
             pass_: str, status: str = "ok") -> dict:
  """A cell's identity (op, impl, pass and shape) and status."""
  return {"op": op, "impl": impl, "pass": pass_, "dtype": dtype, "d_model": d_model,
          "experts": experts, "tokens": scale.tokens, "group": scale.group, "k": scale.k,
          "status": status}


def bench_shape(scale: Scale, dtype: str, d_model: int, experts: int, impls: list[str],
                budget: Budget) -> list[dict]:
  """All cells of one shape: compiled one by one while the budget lasts, then timed in
  interleaved rounds (benchmarks/cvmm.py) so that load affects every impl alike."""
  memory_limit = device_memory_limit()
  cells, calls = [], {}
  for workload, pass_ in itertools.product(
      workloads(scale, dtype, d_model, experts, impls), PASSES):
    cell = new_cell(scale, dtype, d_model, experts, workload.op, workload.impl, pass_)
    cell["flops"] = workload.fwd_flops * (3 if pass_ == "fwd_bwd" else 1)
    cells.append(cell)
    if budget.left("cvmm") <= 0:
      cell["status"] = "skipped: time budget"
      continue
    progress(budget, f"cvmm {dtype} d_model={d_model} N_E={experts} {workload.op} "
                     f"{workload.impl} {pass_}")
    call = compile_cell(cell, workload, memory_limit, scale.min_sample_ms)
    if call:
      calls[len(cells) - 1] = call
  cvmm_benchmark.time_rows(cells, calls, scale.repeats)
  return cells


def skipped_shape(scale: Scale, dtype: str, d_model: int, experts: int,
                  impls: list[str]) -> list[dict]:
  """The cells of a shape the budget left no time for (no arrays are made)."""
  return [new_cell(scale, dtype, d_model, experts, op, impl, pass_, "skipped: time budget")
          for op in ("cvmm", "moe_layer") for impl in ["dense", *impls] for pass_ in PASSES]


def cvmm_part(scale: Scale, budget: Budget, impls: list[str], save) -> dict:
  """Every shape's cells, most important shape first; `save`s what it has after each shape."""
  peaks = roofline.device_peaks(jax.devices()[0].device_kind)
  result = {"impls": impls, "not_timed": NOT_TIMED, "repeats": scale.repeats,
            "min_sample_ms": scale.min_sample_ms, "cells": []}
  for dtype, d_model, experts in itertools.product(scale.dtypes, scale.d_models,
                                                   scale.experts):
    if budget.left("cvmm") <= 0:
      cells = skipped_shape(scale, dtype, d_model, experts, impls)
    else:
      cells = bench_shape(scale, dtype, d_model, experts, impls, budget)
      derive(cells, peaks)
    result["cells"] += cells
    save("cvmm", {"status": "incomplete", **result})
  return result


# Part 4: training steps.

# comparison: its models, the first the baseline the others' `x_baseline` is over; each a
# (row name, config file module, its spec or None[, the fields it sets over the config's, by
# section]). The sigma-MoE paper's WT-103 S pair, the SwitchHead paper's WT-103 S trio, MoEUT's
# 44M pair.
XLA_ATTENTION = {"model": {"attention_impl": "xla"}}
SCANNED = {"model": {"scan_layers": True}}
CUDNN = {"model": {"attention_core": "cudnn"}}
# d_model 412 -> 416 and d_ff 2053 -> 2056: rows of whole 16-byte vectors in bf16. On the H200
# (2026-11-28) the WT-103 S step's GEMMs took about 5x their floor, one of cuBLAS's kernels an
# Ampere `align2` one; this times whether padding the widths inside the model would pay.
ALIGNED_WIDTHS = {"model": {"d_model": 416, "ff": {"d_ff": 2056}}}
TRAINING = {
    "sigma_moe": (("dense wt103_s", wt103_s_dense, None),
                  ("sigma_moe wt103_s", sigma_moe_paper, "wt103_s")),
    # The same two models with the XL attention core in XLA, the scores in memory (the
    # default, "auto", runs the fused kernels on one GPU: issue 60's before and after).
    "xla_attention": (("dense wt103_s xla attention", wt103_s_dense, None, XLA_ATTENTION),
                      ("sigma_moe wt103_s xla attention", sigma_moe_paper, "wt103_s",
                       XLA_ATTENTION)),
    "switchhead": (("dense 10 heads wt103_s", switchhead_paper, "wt103_s,dense"),
                   ("switchhead wt103_s", switchhead_paper, "wt103_s,switchhead"),
                   ("dense 2 heads wt103_s", switchhead_paper, "wt103_s,dense_few")),
    "moeut": (("dense 44m", moeut_paper, "44m,dense"),
              ("moeut 44m", moeut_paper, "44m,moeut")),
    # The layers under one scan (`model.scan_layers`): compile seconds and step time against
    # the unrolled dense model (issue 60); MoEUT's against its dense baseline.
    "scan_layers": (("dense wt103_s unrolled", wt103_s_dense, None),
                    ("dense wt103_s scanned", wt103_s_dense, None, SCANNED),
                    ("sigma_moe wt103_s scanned", sigma_moe_paper, "wt103_s", SCANNED)),
    "scan_layers_moeut": (("dense 44m unrolled", moeut_paper, "44m,dense"),
                          ("moeut 44m scanned", moeut_paper, "44m,moeut", SCANNED)),
    "aligned_widths": (("dense wt103_s widths 412/2053", wt103_s_dense, None),
                       ("dense wt103_s widths 416/2056", wt103_s_dense, None, ALIGNED_WIDTHS),
                       ("sigma_moe wt103_s width 412", sigma_moe_paper, "wt103_s"),
                       ("sigma_moe wt103_s width 416", sigma_moe_paper, "wt103_s",
                        {"model": {"d_model": 416}})),
    # MoEUT and its dense baseline with cuDNN's fused causal attention (heads of 82 and 41
    # padded to 88 and 48) against MoEUT on the XLA core (issue 60's MoEUT goal).
    "cudnn_attention": (("moeut 44m xla core", moeut_paper, "44m,moeut"),
                        ("moeut 44m cudnn", moeut_paper, "44m,moeut", CUDNN),
                        ("dense 44m cudnn", moeut_paper, "44m,dense", CUDNN)),
    # Dropout masks from XLA's RngBitGenerator instead of threefry (`train.rng_impl`, issue
    # 60: dropout and RNG took 3.7 ms of the dense step on the H200).
    "dropout_rng": (("dense wt103_s threefry", wt103_s_dense, None),
                    ("dense wt103_s rbg", wt103_s_dense, None, {"train": {"rng_impl": "rbg"}}),
                    ("dense wt103_s unsafe_rbg", wt103_s_dense, None,
                     {"train": {"rng_impl": "unsafe_rbg"}})),
}


def shrink_for_smoke(config) -> None:
  """Every model alike to two layers of width 32 (at most 4 heads of 16, so that the many-
  and few-head models stay distinct; 4 experts of 8)."""
  config.data.update(batch_size=2, seq_len=16)
  config.model.update(d_model=32, n_layers=2, n_heads=min(config.model.n_heads, 4), head_dim=16,
                      mem_len=min(config.model.mem_len, 16))
  if config.model.get("attention_experts"):
    config.model.update(attention_experts=4, attention_k=2)
  if config.model.ff.kind == "dense":
    config.model.ff.d_ff = 32
  else:
    config.model.ff.update(n_experts=4, expert_size=8, k=2)


def training_configs(comparisons: list[str], smoke: bool) -> list[tuple[str, str, object]]:
  """(comparison, row name, config) of each model of `comparisons`, in the order given,
  bfloat16 compute (f32 parameters); with `smoke`, shrunk (`shrink_for_smoke`)."""
  rows = []
  for comparison in comparisons:
    for name, module, spec, *fields in TRAINING[comparison]:
      config = module.get_config() if spec is None else module.get_config(spec)
      config.model.dtype = "bfloat16"
      for section, values in (fields[0] if fields else {}).items():
        config[section].update(values)
      if config.data.name == "text_files":  # MoEUT's: a path the task checks but never opens
        config.data.file = "random_tokens.txt"
      if smoke:
        shrink_for_smoke(config)
      rows.append((comparison, name, config))
  return rows


def model_key(config) -> tuple:
  """What makes two rows one training step: the model and train sections and the batch
  shape."""
  return (config.model.to_json(sort_keys=True), config.train.to_json(sort_keys=True),
          config.data.batch_size, config.data.seq_len)


def build_training(config) -> tuple[LMTrainStep, dict, float]:
  """The config's training step on one device, compiled, its random batch, and the seconds
  the compilation took."""
  train_step = LMTrainStep(config, parallel.make_mesh([1, 1, 1]))
  batch = train_step.random_batch(np.random.default_rng(0))
  start = time.perf_counter()
  train_step.compile(batch)
  return train_step, batch, time.perf_counter() - start


def time_training(config, steps: int, keep: dict | None = None) -> dict:
  """The jitted training step on one device, fed random tokens, after one warm-up step:
  `step_ms`, the mean of `steps` steps run as training runs them (the next dispatched before
  the last is waited for: `LMTrainStep.run`), and `synced_step_ms`, the median of `steps`
  steps each waited for (the host's dispatch of every step included: before 2026-11-29 the
  suite's only time); its compile seconds, model FLOPs (`lm_step_flops`) and MFU (of
  `step_ms`) against the device's bfloat16 peak (`roofline.PEAKS`; None off that table); the
  compiled step's peak memory. With `keep`, the compiled step and its batch are left there
  under `model_key(config)` (for the step_profile part)."""
  train_step, batch, compile_s = build_training(config)
  mesh, compiled = train_step.mesh, train_step.step_fn
  if keep is not None:
    keep[model_key(config)] = (train_step, batch)
  synced = []
  with jax.set_mesh(mesh):
    for step in range(steps + 1):
      start = time.perf_counter()
      train_step(batch, step)
      synced.append(time.perf_counter() - start)
    start = time.perf_counter()
    metrics = train_step.run(batch, steps + 1, steps)
    step_ms = 1e3 * (time.perf_counter() - start) / steps
  batch_size, seq_len = config.data.batch_size, config.data.seq_len
  peaks = roofline.device_peaks(jax.devices()[0].device_kind)
  tflop = train_step.flops_per_step / 1e12
  return {"step_ms": step_ms, "synced_step_ms": 1e3 * statistics.median(synced[1:]),
          "tokens_per_second": batch_size * seq_len / step_ms * 1e3,
          "compile_s": compile_s, "model_tflop_per_step": tflop,
          "mfu": peaks and tflop / (step_ms / 1e3) / peaks.tflops["bfloat16"],
          "peak_memory_bytes": cvmm_benchmark.peak_memory_bytes(compiled),
          "loss": float(metrics["loss"])}


def training_part(scale: Scale, budget: Budget, comparisons: list[str],
                  compiled: dict | None = None) -> dict:
  """One row per model of `comparisons`; `x_baseline` is its comparison's baseline (first
  model) step time over this one's. A model already timed under another name (the sigma-MoE
  and SwitchHead papers' WT-103 S dense baselines are one model) is not compiled again: its
  row repeats that row's numbers and says so (`same_model_as`). The compiled steps of
  `STEP_PROFILE`'s models are left in `compiled` (`time_training`)."""
  rows, timed = [], {}
  for comparison, name, config in training_configs(comparisons, scale.smoke):
    key = model_key(config)
    row = {"comparison": comparison, "model": name, "batch_size": config.data.batch_size,
           "seq_len": config.data.seq_len, "dtype": config.model.dtype,
           "ff": config.model.ff.to_dict(), "attention": config.model.get("attention", "xl"),
           "attention_impl": config.model.get("attention_impl", "auto"),
           "attention_core": config.model.get("attention_core", "auto"),
           "scan_layers": config.model.get("scan_layers", False),
           "rng_impl": config.train.get("rng_impl", "threefry"), "status": "ok"}
    rows.append(row)
    if key in timed:
      row.update({k: v for k, v in timed[key].items() if k not in row}, status="ok",
                 same_model_as=timed[key]["model"])
      continue
    if budget.left("training") <= 0:
      row["status"] = "skipped: time budget"
      continue
    progress(budget, f"training: {name}")
    try:
      row["params"] = model_report(config.model)["total_params"]
      keep = compiled if compiled is not None and name in STEP_PROFILE else None
      row.update(time_training(config, scale.train_steps, keep))
      timed[key] = row
    except Exception as error:  # A config's failure is its row; the suite goes on.
      row.update(status="error", error=error_text(error))
  for comparison in comparisons:
    baseline = next(r for r in rows if r["comparison"] == comparison)
    for row in rows:
      if row["comparison"] == comparison and "ok" == row["status"] == baseline["status"]:
        row["x_baseline"] = baseline["step_ms"] / row["step_ms"]
  return {"steps": scale.train_steps, "rows": rows}


# Part 5: where the training step's time goes.

# Rows of TRAINING, in order; one the training part did not compile is compiled here only
# while the part's share lasts.
STEP_PROFILE = ("dense wt103_s", "sigma_moe wt103_s", "dense wt103_s widths 416/2056",
                "dense wt103_s xla attention", "switchhead wt103_s")


def step_profile_part(scale: Scale, budget: Budget, compiled: dict) -> dict:
  """`step_profile.device_report` of each `STEP_PROFILE` model: the training part's compiled
  step when it left one in `compiled` (profiled whatever the time), else compiled here while
  the part's share lasts. Frees the compiled steps at the end."""
  configs = {name: config for _, name, config in training_configs(list(TRAINING), scale.smoke)}
  rows = []
  for name in STEP_PROFILE:
    config = configs[name]
    row = {"model": name, "batch_size": config.data.batch_size,
           "seq_len": config.data.seq_len, "dtype": config.model.dtype, "status": "ok"}
    rows.append(row)
    cached = compiled.get(model_key(config))
    if cached is None and budget.left("step_profile") <= 0:
      row["status"] = "skipped: time budget"
      continue
    progress(budget, f"step_profile: {name}"
                     f"{' (compiled by the training part)' if cached else ''}")
    try:
      train_step, batch = cached or build_training(config)[:2]
      report = step_profile.device_report(train_step, batch, steps=scale.profile_steps, warmup=1)
      row.update(report, compiled_by="training part" if cached else "step_profile part")
    except Exception as error:  # A model's failure is its row; the suite goes on.
      row.update(status="error", error=error_text(error))
  compiled.clear()
  return {"steps": scale.profile_steps, "models": rows}


# Part 6: decoding.

def decode_part(scale: Scale, out_dir: pathlib.Path, budget: Budget) -> dict:
  """benchmarks/decode.py's `main` (defaults on a GPU, tiny with --smoke); its table goes
  to stderr, its rows into the report."""
  if budget.left("decode") <= 0:
    return {"status": "skipped: time budget"}
  out = out_dir / "decode.json"
  argv = ["benchmarks/decode.py", f"--out={out}", *scale.decode_argv]
  with mock.patch.object(sys, "argv", argv), contextlib.redirect_stdout(sys.stderr):
    decode.main()
  result = json.loads(out.read_text())
  return {"settings": {key: result[key] for key in ("d_model", "layers", "context", "repeats")},
          "rows": result["rows"]}


# The suite.

class Report:
  """The suite's JSON and Markdown, rewritten in DIR after every part."""

  def __init__(self, out_dir: pathlib.Path, meta: dict, budget: Budget):
    self.out_dir, self.budget = out_dir, budget
    self.data = {"meta": meta}

  def save(self, part: str, result: dict) -> None:
    self.data[part] = result
    self.data["meta"]["elapsed_s"] = self.budget.elapsed()
    (self.out_dir / "gpu_suite.json").write_text(json.dumps(self.data, indent=1))
    (self.out_dir / "gpu_suite.md").write_text(gpu_suite_tables.markdown(self.data))


def side_by_side_part(scale: Scale, out_dir: pathlib.Path, budget: Budget,
                      theirs: str | None) -> dict:
  """Our cvmm beside the dense-equivalent probe and their kernels
  (`benchmarks.cvmm_side_by_side`), within what is left of the budget."""
  left = budget.left("side_by_side")
  if left <= 0:
    return {"status": "skipped: time budget"}
  return cvmm_side_by_side.suite_part(out_dir, left, theirs=theirs, smoke=scale.smoke)


def quality_part(scale: Scale, out_dir: pathlib.Path, budget: Budget, quality_args: str | None,
                 data: str | None) -> dict:
  """`benchmarks.quality_small` with `quality_args` (default `QUALITY_ARGS`: the 12
  `quality_medium` runs), `QUALITY_JOBS` runs at a time, until the budget ends; runs on the
  corpora staged in `data` (`quality_small --stage_corpora`: this machine's Python and files
  make other ones), float32 matmuls in full precision as on the CPU. Finished runs are in
  DIR/quality.json (rewritten as each finishes), the log in DIR/quality.log."""
  left = budget.left("quality")
  if left <= 0:
    return {"status": "skipped: time budget"}
  quality_args = quality_args or (SMOKE_QUALITY_ARGS if scale.smoke else QUALITY_ARGS)
  workdir = pathlib.Path(data).resolve() if data else out_dir / "quality_runs"
  out, log = out_dir / "quality.json", out_dir / "quality.log"
  command = [sys.executable, "-m", "benchmarks.quality_small", *shlex.split(quality_args),
             f"--jobs={1 if scale.smoke else QUALITY_JOBS}", f"--workdir={workdir}",
             f"--out={out}"]
  env = {"JAX_DEFAULT_MATMUL_PRECISION": "highest", "JAX_PLATFORMS": "" if scale.smoke else
         "cuda,cpu", **({"TFDS_DATA_DIR": str(workdir / "tensorflow_datasets")} if data else {})}
  progress(budget, f"quality: {' '.join(command[1:])} (timeout {left:.0f} s, log {log})")
  returncode = run_with_timeout(command, log, left, env)
  result = {"command": " ".join(["python", *command[1:]]), "returncode": returncode}
  if not out.exists():
    return {**result, "status": "error", "error": f"no run finished; last output:\n{tail(log)}"}
  recorded = json.loads(out.read_text())
  return {**result, "runs": len(recorded["runs"]), "summary": recorded["summary"]}


def run_part(report: Report, budget: Budget, name: str, part, *args) -> None:
  """Runs a part; an exception becomes the part's error (with its traceback)."""
  progress(budget, f"part {name}")
  start = time.perf_counter()
  try:
    result = {"status": "ok", **part(*args)}
  except Exception as error:  # A part's failure is its result; the suite goes on.
    result = {"status": "error", "error": error_text(error),
              "traceback": traceback.format_exc()[-8000:]}
  result["elapsed_s"] = time.perf_counter() - start
  report.save(name, result)


def parse_args(argv):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--out", required=True, help="directory for the JSON, Markdown and logs")
  parser.add_argument("--budget_s", type=float, default=420.0,
                      help="seconds from the start after which no cell starts")
  parser.add_argument("--blocked", action="store_true",
                      help="also time impl='blocked' (the XLA path for CPU/TPU; on with --smoke)")
  parser.add_argument("--parts", default=",".join(DEFAULT_PARTS),
                      help=f"comma-separated parts to run, of {','.join(PARTS)} (the "
                           "environment always runs); the others read 'skipped: --parts'")
  parser.add_argument("--theirs", default=None,
                      help="side_by_side: their staged sources (python -m "
                           "benchmarks.cvmm_side_by_side --stage_theirs=third_party); without "
                           "it, ours and the probes only")
  parser.add_argument("--tests", default=",".join(TEST_PATHS),
                      help="comma-separated test paths the tests part runs on the GPU")
  parser.add_argument("--training", default=",".join(TRAINING),
                      help=f"comma-separated comparisons the training part times, of "
                           f"{','.join(TRAINING)}")
  parser.add_argument("--quality", default=None,
                      help=f"quality: arguments for benchmarks.quality_small (default "
                           f"{QUALITY_ARGS!r}; the part adds --jobs, --workdir and --out)")
  parser.add_argument("--quality_data", default=None,
                      help="quality: the corpora staged by `python -m benchmarks.quality_small "
                           "--stage_corpora=DIR --corpora=builtin,prose`, and where runs go")
  parser.add_argument("--smoke", action="store_true",
                      help="tiny shapes, tests skipped: checks the suite itself, on CPU")
  args = parser.parse_args(argv)
  for flag, allowed in (("parts", PARTS), ("training", tuple(TRAINING))):
    chosen = [name for name in getattr(args, flag).split(",") if name]
    unknown = sorted(set(chosen) - set(allowed))
    if unknown:
      parser.error(f"--{flag}: unknown {unknown}; allowed: {', '.join(allowed)}")
    setattr(args, flag, chosen)
  args.tests = [path for path in args.tests.split(",") if path]
  return args


def main(argv=None) -> dict:
  args = parse_args(argv)
  if not args.smoke and jax.default_backend() != "gpu":
    sys.exit("no GPU found: run with --smoke to check the suite on CPU")
  budget = Budget(args.budget_s)
  scale = SMOKE if args.smoke else GPU
  out_dir = pathlib.Path(args.out).resolve()
  out_dir.mkdir(parents=True, exist_ok=True)
  command = ["python -m benchmarks.gpu_suite", *(sys.argv[1:] if argv is None else argv)]
  report = Report(out_dir, {"command": " ".join(command), "smoke": args.smoke,
                            "budget_s": args.budget_s, "part_ends": PART_ENDS,
                            "scale": dataclasses.asdict(scale)}, budget)
  run_part(report, budget, "environment", environment_part)
  impls = suite_impls(args.blocked or args.smoke)
  compiled = {}  # training steps the training part compiled, for step_profile
  parts = {"tests": (tests_part, scale, out_dir, budget, args.tests),
           "cvmm": (cvmm_part, scale, budget, impls, report.save),
           "training": (training_part, scale, budget, args.training,
                        compiled if "step_profile" in args.parts else None),
           "step_profile": (step_profile_part, scale, budget, compiled),
           "decode": (decode_part, scale, out_dir, budget),
           "side_by_side": (side_by_side_part, scale, out_dir, budget, args.theirs),
           "quality": (quality_part, scale, out_dir, budget, args.quality, args.quality_data)}
  for name, (part, *part_args) in parts.items():
    if name in args.parts:
      run_part(report, budget, name, part, *part_args)
    else:
      report.save(name, {"status": "skipped: --parts"})
  progress(budget, f"done: {out_dir / 'gpu_suite.json'}, {out_dir / 'gpu_suite.md'}")
  print(gpu_suite_tables.markdown(report.data))
  return report.data


if __name__ == "__main__":
  main()
