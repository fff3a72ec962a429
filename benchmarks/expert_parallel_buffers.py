"""Buffer bytes of the expert-parallel exchanges: padded `all_to_all` vs `ragged_all_to_all`.

    python -m benchmarks.expert_parallel_buffers [--tokens=2048] [--d_model=256] [--experts=8]
        [--k=2] [--recv_factors=2,1.5] [--out=benchmarks/expert_parallel_buffers_cpu.json]

One MoE layer's expert computation (`expert_parallel.apply_experts`) on 8 simulated CPU
devices, as `expert=8` and as `data=2 x expert=4`, with the tokens split over all 8. For each
exchange (padded; ragged with the worst-case receive buffer; ragged with each
`recv_factor`) the call is traced, not run (XLA:CPU cannot run ragged-all-to-all), and the
send and receive buffers of every collective in it are summed per device from their static
shapes: a forward call and a training call (forward and backward). The bytes do not depend
on the routing; whether a bounded receive buffer holds a step does, so for uniform, skewed
(Zipf) and hot (every token on experts 0..k-1) routings the most rows any device must
receive is listed beside the capacities. Prints the tables and writes JSON.
"""

import argparse
import json
import math
import os
import platform

import jax

if __name__ == "__main__":  # before any JAX operation creates the CPU backend
  jax.config.update("jax_num_cpu_devices", 8)

import jax.numpy as jnp
import numpy as np
from jax.extend import core

from sparse_jax import parallel
from sparse_jax.layers import expert_parallel

MESHES = {"expert=8": (1, 1, 8), "data=2 x expert=4": (2, 1, 4)}
COLLECTIVES = ("all_to_all", "ragged_all_to_all", "all_gather")
ROUTINGS = ("uniform", "skewed", "hot")


def collective_bytes(jaxpr) -> tuple[int, int]:
  """(send, receive) bytes per device of the collectives in `jaxpr` and the jaxprs inside it
  (inside `shard_map` shapes are per device): operands sent, buffers received into."""
  send = recv = 0
  for eqn in jaxpr.eqns:
    if eqn.primitive.name in COLLECTIVES:
      send += eqn.invars[0].aval.size * eqn.invars[0].aval.dtype.itemsize
      recv += eqn.outvars[0].aval.size * eqn.outvars[0].aval.dtype.itemsize
    for param in eqn.params.values():
      for sub in param if isinstance(param, (tuple, list)) else [param]:
        if isinstance(sub, (core.Jaxpr, core.ClosedJaxpr)):
          s, r = collective_bytes(getattr(sub, "jaxpr", sub))
          send, recv = send + s, recv + r
  return send, recv


def layer_call(exchange: str, recv_factor: float | None):
  """One MoE layer call's expert computation, and a training call's (value and gradients)."""

  def forward(x, sel, gates, w_up, w_down):
    return expert_parallel.apply_experts(x, sel, gates, w_up, w_down, impl="blocked",
                                         exchange=exchange, recv_factor=recv_factor)

  def train(*args):
    return jax.value_and_grad(lambda *a: jnp.sum(forward(*a)), argnums=(0, 2, 3, 4))(*args)

  return forward, train


def buffer_row(mesh_shape, exchange, recv_factor, args, shapes) -> dict:
  """Static send/receive bytes per device of one exchange on one mesh."""
  forward, train = layer_call(exchange, recv_factor)
  with jax.set_mesh(parallel.make_mesh(mesh_shape)):
    fwd_send, fwd_recv = collective_bytes(jax.make_jaxpr(forward)(*shapes).jaxpr)
    train_send, train_recv = collective_bytes(jax.make_jaxpr(train)(*shapes).jaxpr)
  n_ep = mesh_shape[2]
  slots = args.tokens // math.prod(mesh_shape) * args.k
  rows = (n_ep * slots if exchange == "padded"
          else expert_parallel.recv_rows(n_ep, slots, recv_factor))
  return {"exchange": exchange, "recv_factor": recv_factor, "recv_rows": rows,
          "fwd_send_bytes": fwd_send, "fwd_recv_bytes": fwd_recv,
          "fwd_bytes": fwd_send + fwd_recv, "train_bytes": train_send + train_recv}


def routing(name: str, tokens: int, experts: int, k: int, seed: int = 0) -> np.ndarray:
  """`sel [tokens, k]`, k distinct experts per token (Gumbel top-k): uniform, Zipf-skewed
  (p_e proportional to 1 / (e + 1)), or hot (every token on experts 0..k-1)."""
  if name == "hot":
    return np.tile(np.arange(k), (tokens, 1))
  log_p = np.zeros(experts) if name == "uniform" else -np.log(np.arange(1, experts + 1))
  gumbel = np.random.default_rng(seed).gumbel(size=(tokens, experts))
  return np.argsort(-(log_p + gumbel), axis=1)[:, :k]


def rows_needed(sel: np.ndarray, mesh_shape, experts: int) -> int:
  """The most slots one device receives: the tokens split over the devices in mesh order,
  so each expert group (devices sharing their data and fsdp coordinates) holds a contiguous
  block of them and exchanges among itself."""
  n_ep = mesh_shape[2]
  dest_gs = (sel // (experts // n_ep)).reshape(mesh_shape[0] * mesh_shape[1], -1)
  return int(max(np.bincount(dest_s, minlength=n_ep).max() for dest_s in dest_gs))


def main(argv=None) -> dict:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--tokens", type=int, default=2048)
  parser.add_argument("--d_model", type=int, default=256)
  parser.add_argument("--expert_size", type=int, default=128)
  parser.add_argument("--experts", type=int, default=8)
  parser.add_argument("--k", type=int, default=2)
  parser.add_argument("--dtype", default="float32")
  parser.add_argument("--recv_factors", default="2,1.5")
  parser.add_argument("--out", default="benchmarks/expert_parallel_buffers_cpu.json")
  args = parser.parse_args(argv)
  dtype = jnp.dtype(args.dtype)
  shapes = (jax.ShapeDtypeStruct((args.tokens, args.d_model), dtype),
            jax.ShapeDtypeStruct((args.tokens, args.k), jnp.int32),
            jax.ShapeDtypeStruct((args.tokens, args.k), dtype),
            jax.ShapeDtypeStruct((args.experts, args.d_model, args.expert_size), dtype),
            jax.ShapeDtypeStruct((args.experts, args.expert_size, args.d_model), dtype))
  exchanges = [("padded", None), ("ragged", None)] + [
      ("ragged", float(f)) for f in args.recv_factors.split(",") if f]
  sels = {name: routing(name, args.tokens, args.experts, args.k) for name in ROUTINGS}
  rows = []
  for mesh_name, mesh_shape in MESHES.items():
    needed = {name: rows_needed(sel, mesh_shape, args.experts) for name, sel in sels.items()}
    for exchange, factor in exchanges:
      row = {"mesh": mesh_name, "slots_per_device": args.tokens // 8 * args.k,
             **buffer_row(mesh_shape, exchange, factor, args, shapes), "rows_needed": needed}
      row["fits"] = [name for name, n in needed.items() if n <= row["recv_rows"]]
      rows.append(row)
  print(f"{'mesh':<18} {'exchange':<12} {'recv rows':>9} {'fwd send KiB':>12} "
        f"{'fwd recv KiB':>12} {'fwd KiB':>9} {'x padded':>8} {'train KiB':>10}  fits")
  for r in rows:
    padded = next(p for p in rows if p["mesh"] == r["mesh"] and p["exchange"] == "padded")
    r["vs_padded"] = r["fwd_bytes"] / padded["fwd_bytes"]
    name = r["exchange"] + (f" x{r['recv_factor']:g}" if r["recv_factor"] else "")
    print(f"{r['mesh']:<18} {name:<12} {r['recv_rows']:>9} {r['fwd_send_bytes'] / 1024:>12.0f} "
          f"{r['fwd_recv_bytes'] / 1024:>12.0f} {r['fwd_bytes'] / 1024:>9.0f} "
          f"{r['vs_padded']:>8.2f} {r['train_bytes'] / 1024:>10.0f}  {' '.join(r['fits'])}")
  print(f"\nrows one device must receive (C = {args.tokens // 8 * args.k} slots per device)")
  for mesh_name in MESHES:
    needed = next(r["rows_needed"] for r in rows if r["mesh"] == mesh_name)
    print(f"{mesh_name:<18} " + "  ".join(f"{n}: {v}" for n, v in needed.items()))
  result = {"machine": f"{platform.machine()}, {os.cpu_count()} cores, "
                       f"{jax.default_backend()} ({jax.device_count()} devices)",
            "jax": jax.__version__, **vars(args), "rows": rows}
  with open(args.out, "w") as f:
    json.dump(result, f, indent=2)
  print(f"wrote {args.out}")
  return result


if __name__ == "__main__":
  main()
