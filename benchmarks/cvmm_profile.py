"""Where one sigma-MoE layer's forward + backward spends its time, stage by stage.

    python -m benchmarks.cvmm_profile [--experts 32,128] [--impl blocked] [--output FILE]

The layer of `benchmarks/cvmm.py` (`expert_mlp`: d_model, N_E experts of G units, top-K)
is cut into the stages `pallas_kernels/expert_mlp.py` runs, each jitted alone on inputs
computed beforehand, plus the router a sigma-MoE layer runs before it:

  forward:  routing (x @ W_sel, sigmoid, top-K), layout (sort by expert, blocks), x gather,
            up matmul, activation and gate, down matmul, gather-sum to tokens
  backward: dy gather, down input grad, gate grad, down weight grad, activation grad,
            up input grad, dx gather-sum, x gather again, up weight grad

Per stage: median ms (stages interleaved, so machine load hits all alike), the bytes its
arguments and results occupy (a lower bound on its memory traffic), its FLOPs and rate
(matmuls: the multiply-adds the impl runs, padding rows included, and the useful ones), and
its share of the stages' sum. The same run times the whole layer jitted as one, forward +
backward, and the parameter-matched dense MLP (d_ff = G * N_E), whose rate is what the MoE's
matmul stages are compared with. Prints a table per N_E and writes JSON.
"""

import argparse
import dataclasses
import sys

import jax
import jax.numpy as jnp

from benchmarks import machine
from benchmarks.cvmm import (dense_mlp, dense_weights, forward_and_backward, moe_layer,
                             random_layer, time_interleaved_ms)
from pallas_kernels import backends, blocked, slot_layout


@dataclasses.dataclass
class Stage:
  name: str
  fn: object  # jitted
  args: tuple
  flops: float = 0.0  # what the impl multiplies, padding rows included
  useful_flops: float = 0.0  # the slots' own rows only


def _nbytes(tree) -> int:
  return sum(a.size * a.dtype.itemsize for a in jax.tree.leaves(tree) if hasattr(a, "dtype"))


def _router(x_nd, w_sel_de, k):
  """sigma-MoE's router (Eq. 19): sigmoid scores, top-K."""
  gates_nk, sel_nk = jax.lax.top_k(jax.nn.sigmoid(x_nd @ w_sel_de), k)
  return sel_nk.astype(jnp.int32), gates_nk


def _to_tokens(z_rd, layout, n, k):
  return jnp.take(z_rd, layout.slot_row_s, axis=0).reshape(n, k, -1).astype(jnp.float32).sum(1)


def layer_stages(impl: str, x_nd, sel_nk, gates_nk, w1_edg, w2_egd, ct_nd) -> list[Stage]:
  """The stages of `expert_mlp`'s forward and backward (no dropout, ReLU), mirroring
  `_fused_fwd` / `_fused_bwd` step by step, each with its inputs computed beforehand."""
  backend = backends.backend(impl)
  (n, k), (num_experts, d_model, group) = sel_nk.shape, w1_edg.shape
  w_sel_de = jax.random.normal(jax.random.key(0), (d_model, num_experts), x_nd.dtype)
  layout = jax.jit(lambda s: backend.make_layout(s.reshape(-1), num_experts))(sel_nk)
  rows = layout.row_slot_r.shape[0]
  if isinstance(layout.groups, blocked.BlockGroups):  # Only the blocks in use are multiplied.
    rows = int(layout.groups.used) * (rows // layout.groups.expert_b.shape[0])
  slots = n * k
  matmul = lambda a, b: (2.0 * rows * a * b, 2.0 * slots * a * b)

  def run(f, *args):
    return jax.jit(f)(*args)

  x_rd = run(lambda x, l: slot_layout.rows_from_tokens(x, l, k), x_nd, layout)
  g_r = run(lambda g, l: slot_layout.rows_from_slots(g.reshape(-1).astype(jnp.float32), l),
            gates_nk, layout)
  up = lambda l, x, w: backend.matmul(l, x, w, transpose=False, out_dtype=x.dtype)
  h_rg = run(up, layout, x_rd, w1_edg)
  hidden = lambda h, g: (jax.nn.relu(h).astype(jnp.float32) * g[:, None]).astype(h.dtype)
  ga_rg = run(hidden, h_rg, g_r)
  down = lambda l, a, w: backend.matmul(l, a, w, transpose=False, out_dtype=jnp.float32)
  z_rd = run(down, layout, ga_rg, w2_egd)
  dy_rd = run(lambda d, l: slot_layout.rows_from_tokens(d, l, k), ct_nd, layout)
  down_t = lambda l, d, w: backend.matmul(l, d, w, transpose=True, out_dtype=jnp.float32)
  da_rg = run(down_t, layout, dy_rd, w2_egd)
  dh = lambda da, g, h: (da * g[:, None] * (h > 0)).astype(h.dtype)
  dh_rg = run(dh, da_rg, g_r, h_rg)
  wgrad = lambda l, a, b: backend.weight_grad(l, a, b, num_experts=num_experts,
                                              out_dtype=a.dtype)
  up_t = lambda l, d, w: backend.matmul(l, d, w, transpose=True, out_dtype=jnp.float32)
  dx_rd = run(up_t, layout, dh_rg, w1_edg)
  stages = [
      Stage("routing", lambda x, w: _router(x, w, k), (x_nd, w_sel_de),
            2.0 * n * d_model * num_experts, 2.0 * n * d_model * num_experts),
      Stage("layout", lambda s: backend.make_layout(s.reshape(-1), num_experts), (sel_nk,)),
      Stage("x gather", lambda x, l: slot_layout.rows_from_tokens(x, l, k), (x_nd, layout)),
      Stage("up matmul", up, (layout, x_rd, w1_edg), *matmul(d_model, group)),
      Stage("activation, gate", hidden, (h_rg, g_r)),
      Stage("down matmul", down, (layout, ga_rg, w2_egd), *matmul(group, d_model)),
      Stage("gather-sum", lambda z, l: _to_tokens(z, l, n, k), (z_rd, layout)),
      Stage("bwd: dy gather", lambda d, l: slot_layout.rows_from_tokens(d, l, k),
            (ct_nd, layout)),
      Stage("bwd: down input grad", down_t, (layout, dy_rd, w2_egd), *matmul(d_model, group)),
      Stage("bwd: gate grad", lambda da, h: jnp.sum(da * jax.nn.relu(h), axis=-1),
            (da_rg, h_rg)),
      Stage("bwd: down weight grad", wgrad, (layout, ga_rg, dy_rd), *matmul(group, d_model)),
      Stage("bwd: activation grad", dh, (da_rg, g_r, h_rg)),
      Stage("bwd: up input grad", up_t, (layout, dh_rg, w1_edg), *matmul(group, d_model)),
      Stage("bwd: dx gather-sum", lambda d, l: _to_tokens(d, l, n, k), (dx_rd, layout)),
      Stage("bwd: x gather again", lambda x, l: slot_layout.rows_from_tokens(x, l, k),
            (x_nd, layout)),
      Stage("bwd: up weight grad", wgrad, (layout, x_rd, dh_rg), *matmul(d_model, group)),
  ]
  for stage in stages:
    stage.fn = jax.jit(stage.fn)
  return stages


def profile_point(experts: int, args) -> dict:
  """The stage table of one N_E, with the whole layer and the dense MLP timed alongside."""
  x_nd, sel_nk, gates_nk, w1_edg, w2_egd, ct_nd = random_layer(
      jax.random.key(experts), args.tokens, args.d_model, args.group, args.k, experts,
      jnp.dtype(args.dtype))
  stages = layer_stages(args.impl, x_nd, sel_nk, gates_nk, w1_edg, w2_egd, ct_nd)
  layer = lambda ct, x, w1, w2, g, s: forward_and_backward(
      lambda x, w1, w2, g: moe_layer(x, s, g, w1, w2, args.impl), (0, 1, 2, 3))(ct, x, w1, w2, g)
  dense = forward_and_backward(dense_mlp, (0, 1, 2))
  dense_args = (ct_nd, x_nd, *dense_weights(w1_edg, w2_egd))
  calls = {s.name: (s.fn, s.args) for s in stages}
  calls["whole layer"] = (jax.jit(layer), (ct_nd, x_nd, w1_edg, w2_egd, gates_nk, sel_nk))
  calls["dense MLP"] = (jax.jit(dense), dense_args)
  ms = time_interleaved_ms(calls, args.repeats)
  dense_flops = 6 * 2.0 * args.tokens * args.d_model * args.group * experts
  total = sum(ms[s.name] for s in stages)
  rows = []
  for s in stages:
    out = s.fn(*s.args)
    rows.append(dict(stage=s.name, ms=ms[s.name], share=ms[s.name] / total,
                     bytes=_nbytes(s.args) + _nbytes(out), flops=s.flops,
                     useful_flops=s.useful_flops,
                     gflops_per_s=s.flops / ms[s.name] / 1e6 if s.flops else None))
  return dict(experts=experts, stages=rows, stages_ms=total, whole_layer_ms=ms["whole layer"],
              dense_ms=ms["dense MLP"], dense_gflops_per_s=dense_flops / ms["dense MLP"] / 1e6,
              whole_layer_x_dense=ms["dense MLP"] / ms["whole layer"])


def format_point(point: dict) -> str:
  lines = [f"N_E {point['experts']}: whole layer fwd+bwd {point['whole_layer_ms']:.1f} ms, "
           f"stages' sum {point['stages_ms']:.1f} ms, dense MLP {point['dense_ms']:.1f} ms "
           f"({point['dense_gflops_per_s']:.0f} GFLOP/s): {point['whole_layer_x_dense']:.2f}x "
           "dense",
           "| stage | ms | share | MB | GFLOP (useful) | GFLOP/s | x dense rate |",
           "|---|---:|---:|---:|---:|---:|---:|"]
  for r in point["stages"]:
    rate, flops, vs_dense = r["gflops_per_s"], "-", "-"
    if rate is not None:
      flops = f"{r['flops'] / 1e9:.2f} ({r['useful_flops'] / 1e9:.2f})"
      vs_dense = f"{rate / point['dense_gflops_per_s']:.2f}"
      rate = f"{rate:.0f}"
    lines.append(f"| {r['stage']} | {r['ms']:.2f} | {r['share']:.0%} | {r['bytes'] / 1e6:.1f} "
                 f"| {flops} | {rate or '-'} | {vs_dense} |")
  return "\n".join(lines)


def _parse(argv):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--experts", default="32,128", help="comma-separated N_E values")
  parser.add_argument("--impl", default="blocked", help="a cvmm impl with a backend")
  parser.add_argument("--tokens", type=int, default=4096)
  parser.add_argument("--d_model", type=int, default=512)
  parser.add_argument("--group", type=int, default=128)
  parser.add_argument("--k", type=int, default=4)
  parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
  parser.add_argument("--repeats", type=int, default=7)
  parser.add_argument("--output", default="benchmarks/cvmm_profile_cpu.json")
  return parser.parse_args(argv)


def main(argv=None) -> list[dict]:
  args = _parse(argv)
  result = {"machine": machine.machine_info(), "argv": sys.argv[1:] if argv is None else argv,
            "args": vars(args), "points": []}
  for experts in (int(e) for e in args.experts.split(",") if e):
    result["points"].append(profile_point(experts, args))
    print(format_point(result["points"][-1]), flush=True)
  machine.write_result(result, args.output)
  return result["points"]


if __name__ == "__main__":
  main()
