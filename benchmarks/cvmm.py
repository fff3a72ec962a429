"""Benchmark: one sigma-MoE feed-forward layer (`expert_mlp`) vs a parameter-matched dense MLP.

The setting of Fig. 2 of the sigma-MoE paper: |B| tokens of width d_model, N_E experts of
G units, top-K slots per token, against a dense MLP with d_ff = G * N_E (same parameters).

    MoE:   y = expert_mlp(x, sel, gates, W1, W2)                W1 [E, d, G], W2 [E, G, d]
           (= sum_j gates_j ReLU(x W1[sel_j]) W2[sel_j], on one layout in expert order)
    dense: y = ReLU(x @ W1) @ W2                              W1 [d, G*E],  W2 [G*E, d]

Times the jitted forward and forward + backward (gradients of x, W1, W2 and the gates) of
each, per impl, in the same run; prints a table (ms, TFLOP/s on the active multiply-adds,
speed-up over dense) and writes it as JSON. On a machine without a GPU the default is 4096
tokens and the interpreted Pallas impl is skipped (interpret mode measures Python, not the
kernel). Routing is uniform random top-K over distinct experts. Each row also has the peak
memory of the compiled forward and of the forward + backward (`memory_analysis`: arguments,
outputs and temporaries; None where the backend does not say), the paper's dashed lines.

`--sweep` picks the variable of the figure: N_E (Fig. 2, `--experts`), G (Fig. 6) or d_model
(Fig. 7), over `--values`, the other two fixed; each row names its `sweep` variable, whose
value is that row's `experts`, `group` or `d_model`; `python figures.py cvmm
benchmarks/cvmm_cpu_float32.json` plots such a JSON.

    python benchmarks/cvmm.py --dtype float32 --output benchmarks/cvmm_cpu.json
    python benchmarks/cvmm.py --sweep group --values 64,128,256,512 --experts 32
    python benchmarks/cvmm.py --sweep d_model --values 256,512,1024 --experts 32 --group 128
"""

import argparse
import datetime
import json
import platform
import statistics
import sys
import time

import jax
import jax.numpy as jnp

from pallas_kernels import expert_mlp
from pallas_kernels.blocked import full_precision


def moe_layer(x_nd, sel_nk, gates_nk, w1_edg, w2_egd, impl):
  """The MoE feed-forward as the layers run it: `expert_mlp` (one layout for both
  projections: up with the k slots sharing each token row, ReLU, gated down)."""
  return expert_mlp(x_nd, sel_nk, gates_nk, w1_edg, w2_egd, impl=impl)


def dense_projection(x_nd, w_df):
  """x @ w with f32 accumulation, output in the input dtype; f32 products at full precision,
  as in every cvmm impl (a GPU would otherwise round them to TF32)."""
  y_nf = jnp.dot(x_nd, w_df, precision=full_precision(x_nd.dtype),
                 preferred_element_type=jnp.float32)
  return y_nf.astype(x_nd.dtype)


def dense_mlp(x_nd, w1_df, w2_fd):
  """The parameter-matched dense MLP."""
  return dense_projection(jax.nn.relu(dense_projection(x_nd, w1_df)), w2_fd)


def forward_and_backward(fn, argnums):
  """fn's output and the gradients of <fn(...), ct> with respect to `argnums`."""
  def run(ct, *args):
    y, vjp = jax.vjp(lambda *diff: fn(*diff, *args[len(argnums):]), *args[:len(argnums)])
    return y, vjp(ct)
  return run


def time_interleaved_ms(calls: dict, repeats: int) -> dict:
  """Median wall time in ms of each compiled call, after one warm-up call each.

  The calls take turns, one run each per round, so that load from other processes on the
  machine affects all of them alike and the ratios between them stay meaningful.
  """
  for fn, args in calls.values():
    jax.block_until_ready(fn(*args))
  samples = {name: [] for name in calls}
  for _ in range(repeats):
    for name, (fn, args) in calls.items():
      start = time.perf_counter()
      jax.block_until_ready(fn(*args))
      samples[name].append((time.perf_counter() - start) * 1e3)
  return {name: statistics.median(times) for name, times in samples.items()}


def repeated_call(compiled, times: int):
  """`compiled` called `times` times in a row, returning the last output: one timed sample
  of a short kernel then spans several calls, so the host's dispatch and the final sync
  (tens of microseconds) do not inflate it. The device runs the calls in order, so the last
  output is ready only when all are."""
  def run(*args):
    for _ in range(times):
      outputs = compiled(*args)
    return outputs
  return run


def time_rows(rows: list[dict], calls: dict, repeats: int) -> None:
  """Sets `ms` (per call: a sample covers the row's `calls_per_sample` calls) of the rows
  whose compiled calls `calls` holds by row index, timed by `time_interleaved_ms`. A call
  failing in a later round fails the round: every timed row then reads its error."""
  try:
    for index, ms in time_interleaved_ms(calls, repeats).items():
      rows[index]["ms"] = ms / rows[index]["calls_per_sample"]
  except Exception as error:  # Recorded in the rows: the benchmark goes on.
    for index in calls:
      rows[index].update(status="error", error=f"{type(error).__name__}: {error}"[:2000])


def random_routing(key, tokens: int, experts: int, k: int, dtype):
  """Top-k of random scores: k distinct experts per token, gates in (0, 1)."""
  scores_ne = jax.random.uniform(key, (tokens, experts))
  gates_nk, sel_nk = jax.lax.top_k(scores_ne, k)
  return sel_nk.astype(jnp.int32), gates_nk.astype(dtype)


def random_layer(key, tokens: int, d_model: int, group: int, k: int, experts: int, dtype):
  """Inputs of one MoE layer: x_nd, sel_nk, gates_nk, w1_edg, w2_egd and a cotangent ct_nd."""
  keys = jax.random.split(key, 5)
  x_nd = jax.random.normal(keys[0], (tokens, d_model), dtype)
  sel_nk, gates_nk = random_routing(keys[1], tokens, experts, k, dtype)
  w1_edg = (jax.random.normal(keys[2], (experts, d_model, group)) * d_model ** -0.5).astype(dtype)
  w2_egd = (jax.random.normal(keys[3], (experts, group, d_model))
            * (group * experts) ** -0.5).astype(dtype)
  ct_nd = jax.random.normal(keys[4], (tokens, d_model), dtype)
  return x_nd, sel_nk, gates_nk, w1_edg, w2_egd, ct_nd


def dense_weights(w1_edg, w2_egd):
  """The experts side by side as one dense MLP: w1_df [d, E*G], w2_fd [E*G, d]."""
  experts, d_model, group = w1_edg.shape
  return (w1_edg.transpose(1, 0, 2).reshape(d_model, experts * group),
          w2_egd.reshape(experts * group, d_model))


def compiled(fn, args):
  """`fn` jitted and compiled for `args`: timed, and asked for its memory, without compiling
  it a second time."""
  return jax.jit(fn).lower(*args).compile()


def peak_memory_bytes(compiled) -> int | None:
  """Device memory a compiled call needs: temporaries, arguments and outputs (outputs that
  reuse donated arguments counted once); None if the backend does not say."""
  stats = compiled.memory_analysis()
  if stats is None:
    return None
  return (stats.temp_size_in_bytes + stats.argument_size_in_bytes
          + stats.output_size_in_bytes - stats.alias_size_in_bytes)


def peak_memory_mb(executable) -> float | None:
  """`peak_memory_bytes` in MB."""
  total = peak_memory_bytes(executable)
  return None if total is None else total / 1e6


def bench_point(args, experts: int, group: int, d_model: int, impls: list[str]) -> list[dict]:
  """Rows of the table for one shape: dense first, then each impl."""
  k, n = args.k, args.tokens
  x_nd, sel_nk, gates_nk, w1_edg, w2_egd, ct_nd = random_layer(
      jax.random.key(experts * 7919 + group * 31 + d_model), n, d_model, group, k, experts,
      jnp.dtype(args.dtype))

  dense_args = (x_nd, *dense_weights(w1_edg, w2_egd))
  dense_macs = 2 * n * d_model * group * experts
  runs = [("dense", dense_mlp, dense_args, dense_macs, 3)]
  for impl in impls:
    fn = lambda x, w1, w2, gates, sel, impl=impl: moe_layer(x, sel, gates, w1, w2, impl)
    runs.append((impl, fn, (x_nd, w1_edg, w2_egd, gates_nk, sel_nk), 2 * n * k * d_model * group,
                 4))

  calls = {}
  for name, fn, fn_args, _, num_diff in runs:
    train_args = (ct_nd, *fn_args)
    calls[name, "fwd"] = (compiled(fn, fn_args), fn_args)
    calls[name, "fwd_bwd"] = (compiled(forward_and_backward(fn, tuple(range(num_diff))),
                                       train_args), train_args)
  ms = time_interleaved_ms(calls, args.repeats)
  rows = []
  for name, _, _, macs, _ in runs:
    fwd_ms, train_ms = ms[name, "fwd"], ms[name, "fwd_bwd"]
    rows.append(dict(sweep=args.sweep, experts=experts, group=group, d_model=d_model, impl=name,
                     fwd_ms=fwd_ms, fwd_bwd_ms=train_ms,
                     fwd_tflops=2 * macs / fwd_ms / 1e9, fwd_bwd_tflops=6 * macs / train_ms / 1e9,
                     fwd_memory_mb=peak_memory_mb(calls[name, "fwd"][0]),
                     fwd_bwd_memory_mb=peak_memory_mb(calls[name, "fwd_bwd"][0])))
  for row in rows:
    row["fwd_speedup"] = rows[0]["fwd_ms"] / row["fwd_ms"]
    row["fwd_bwd_speedup"] = rows[0]["fwd_bwd_ms"] / row["fwd_bwd_ms"]
  return rows


def sweep_points(args) -> list[tuple[int, int, int]]:
  """(experts, group, d_model) of each point: `--values` of the `--sweep` variable, the other
  two fixed (`--experts` holds the N_E list for the default sweep over experts)."""
  if args.sweep == "experts":
    values = args.values or args.experts
    return [(v, args.group, args.d_model) for v in _ints(values)]
  if not args.values:
    raise SystemExit(f"--sweep {args.sweep} needs --values (comma-separated).")
  experts = _ints(args.experts)
  if len(experts) != 1:
    raise SystemExit(f"--sweep {args.sweep} fixes N_E: give one --experts value, not {experts}.")
  if args.sweep == "group":
    return [(experts[0], v, args.d_model) for v in _ints(args.values)]
  return [(experts[0], args.group, v) for v in _ints(args.values)]


def _ints(text: str) -> list[int]:
  return [int(v) for v in text.split(",") if v]


def _megabytes(value: float | None) -> str:
  return "-" if value is None else f"{value:.1f}"


def format_table(rows: list[dict]) -> str:
  """Markdown table of the benchmark rows."""
  lines = ["| N_E | G | d_model | impl | fwd ms | fwd TFLOP/s | fwd x dense | fwd MB | "
           "fwd+bwd ms | fwd+bwd TFLOP/s | fwd+bwd x dense | fwd+bwd MB |",
           "|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
  for r in rows:
    lines.append(f"| {r['experts']} | {r['group']} | {r['d_model']} | {r['impl']} | "
                 f"{r['fwd_ms']:.1f} | {r['fwd_tflops']:.3f} | {r['fwd_speedup']:.2f} | "
                 f"{_megabytes(r['fwd_memory_mb'])} | {r['fwd_bwd_ms']:.1f} | "
                 f"{r['fwd_bwd_tflops']:.3f} | {r['fwd_bwd_speedup']:.2f} | "
                 f"{_megabytes(r['fwd_bwd_memory_mb'])} |")
  return "\n".join(lines)


def parse_args(argv):
  on_gpu = jax.default_backend() == "gpu"
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--tokens", type=int, default=32768 if on_gpu else 4096)
  parser.add_argument("--d_model", type=int, default=512)
  parser.add_argument("--group", type=int, default=128, help="G, units per expert")
  parser.add_argument("--k", type=int, default=4, help="experts per token")
  parser.add_argument("--experts", default="8,16,32,64,128",
                      help="comma-separated N_E values (one value for the other sweeps)")
  parser.add_argument("--sweep", default="experts", choices=["experts", "group", "d_model"],
                      help="the variable of the figure (Fig. 2 / 6 / 7)")
  parser.add_argument("--values", default=None,
                      help="comma-separated values of --sweep (experts: default --experts)")
  parser.add_argument("--impls", default="pallas,blocked,ragged" if on_gpu else "blocked,ragged",
                      help="comma-separated cvmm impls")
  parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
  parser.add_argument("--repeats", type=int, default=7, help="timed rounds per call")
  parser.add_argument("--output", default="benchmarks/cvmm.json", help="JSON results path")
  return parser.parse_args(argv)


def main(argv=None) -> list[dict]:
  args = parse_args(argv)
  impls = [i for i in args.impls.split(",") if i]
  if jax.default_backend() != "gpu" and "pallas" in impls:
    impls.remove("pallas")
    print("skipping impl=pallas: no GPU, it would run in Pallas interpret mode")
  points = sweep_points(args)
  print(f"jax {jax.__version__} on {jax.devices()[0].device_kind} ({jax.default_backend()}), "
        f"tokens={args.tokens} K={args.k} dtype={args.dtype}, sweep over {args.sweep}")
  rows = []
  for experts, group, d_model in points:
    rows += bench_point(args, experts, group, d_model, impls)
    print(format_table(rows[-len(impls) - 1:]), flush=True)
  print(format_table(rows))
  meta = dict(jax=jax.__version__, backend=jax.default_backend(),
              device=jax.devices()[0].device_kind, machine=platform.machine(),
              date=datetime.date.today().isoformat(), argv=sys.argv[1:] if argv is None else argv,
              **vars(args))
  with open(args.output, "w") as f:
    json.dump(dict(meta=meta, rows=rows), f, indent=1)
  return rows


if __name__ == "__main__":
  main()
