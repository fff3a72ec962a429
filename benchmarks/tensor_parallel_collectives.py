"""Collectives of a tensor-parallel training step, read from its compiled HLO, against Megatron.

    python -m benchmarks.tensor_parallel_collectives [--batch=8] [--seq_len=128]
        [--d_model=256] [--n_heads=8] [--d_ff=1024] [--n_experts=16] [--expert_size=64]
        [--block_size=32] [--attention_experts=4] [--tensors=1,2,4] [--models=dense,...]
        [--out=benchmarks/tensor_parallel_collectives_cpu.json]

The training steps of the dense and of the sigma-MoE LM (Transformer-XL attention with a
memory of `seq_len`, float32, the XLA paths), of Scaling Transformers' LM (sparse FF of `d_ff`
in blocks of `block_size`, sparse QKV attention with one module per head, no memory) and of
the SwitchHead LM (`attention_experts` V and O experts per head, 2 active, no memory; the
sigma-MoE FF) are compiled, not run, on simulated CPU meshes of
`tensor` = 1, 2, 4 devices alone (so every collective is over `tensor`), with 1 and with 2
layers. `sparse_jax.aot.collectives` reads every all-reduce / all-gather / reduce-scatter
from each compiled program; one layer's share is the 2-layer step's minus the 1-layer
step's, split into forward and backward (JAX names backward ops `transpose(...)`), and the
rest of the step (embedding, output layer and loss, optimiser) is the 1-layer step's minus
that. Scalars (the partial sums of the gradient norm over each split parameter) are counted
apart. Megatron's count per layer (Shoeybi et al. 2019): two all-reduces of `B x T x d`
forward (after the attention output and the FF down projection) and two backward (the
input gradients of Q/K/V and of the FF up projection). The sparse QKV attention has no output
layer: its heads are all-gathered instead (half an all-reduce's traffic), and its module
convolutions exchange neighbouring modules (collective-permutes). Each `<model>_sequence_parallel`
is `<model>` with `model.sequence_parallel`, against Megatron's count with sequence
parallelism (Korthikanti et al. 2022): each all-reduce an all-gather of `B x T x d` and a
reduce-scatter into `B x T/t x d`. Bytes are those of the
arrays the collectives produce (what a ring all-reduce moves is 2 (t - 1) / t of that per
device). Prints the table and writes JSON.
"""

import argparse
import collections

import jax

if __name__ == "__main__":  # before any JAX operation creates the CPU backend
  jax.config.update("jax_num_cpu_devices", 8)

from benchmarks.machine import machine_info, write_result
from sparse_jax import parallel, validation
from sparse_jax.aot.collectives import collectives
from sparse_jax.configs import default
from sparse_jax.tasks import task_for
from sparse_jax.training.compile_only import trace_train_step
from sparse_jax.training.placement import Placement

SEQUENCE_PARALLEL = "_sequence_parallel"  # A model's name with it: `model.sequence_parallel`.
MODELS = tuple(kind + sp for kind in ("dense", "sigma_moe", "sparse_ff_qkv", "switchhead")
               for sp in ("", SEQUENCE_PARALLEL))
COUNTED = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")
ABBREVIATIONS = dict(zip(COUNTED, ("AR", "AG", "RS", "A2A", "CP")))


def model_config(kind: str, n_layers: int, tensor: int, args):
  """The default config at the benchmark's sizes: `kind` FF, `n_layers`, a `tensor` mesh."""
  config = default.get_config()
  config.data.update(batch_size=args.batch, seq_len=args.seq_len)
  config.eval.batch_size = args.batch
  config.model.update(d_model=args.d_model, n_layers=n_layers, n_heads=args.n_heads,
                      mem_len=args.seq_len, vocab_size=256, dropout=0.0)
  config.model.sequence_parallel = kind.endswith(SEQUENCE_PARALLEL)
  kind = kind.removesuffix(SEQUENCE_PARALLEL)
  if kind == "dense":
    config.model.ff = {"kind": "dense", "d_ff": args.d_ff}
  elif kind == "sparse_ff_qkv":
    config.model.ff = {"kind": "sparse_ff", "d_ff": args.d_ff, "block_size": args.block_size}
    config.model.update(attention="sparse_qkv", mem_len=0)
  else:  # sigma_moe, and switchhead with the same FF
    config.model.ff.update(n_experts=args.n_experts, expert_size=args.expert_size, k=2,
                           expert_dropout=0.0)
  if kind == "switchhead":
    config.model.update(attention="switchhead", attention_experts=args.attention_experts,
                        attention_k=2, mem_len=0)
  config.mesh = {"data": 1, "tensor": tensor}
  return config


def step_collectives(config, tensor: int) -> list:
  """The collectives of the config's compiled training step on a `tensor` mesh."""
  with validation.inspecting():
    task = task_for(config)
  mesh = parallel.make_mesh((1, 1, 1, tensor))
  with jax.set_mesh(mesh):
    traced = trace_train_step(task, Placement(mesh))[0]
    return collectives(traced.lower().compile().as_text())


def tally(found) -> collections.Counter:
  """Counts and bytes per `(kind, "fwd"|"bwd"|"scalar")`, and how many run in loops."""
  counts = collections.Counter()
  for c in found:
    part = "scalar" if not c.shape else "bwd" if c.backward else "fwd"
    counts[(c.kind, part, "n")] += 1
    counts[(c.kind, part, "bytes")] += c.nbytes
    counts["in_loop"] += c.in_loop
  return counts


def row(kind: str, tensor: int, args) -> dict:
  one, two = (tally(step_collectives(model_config(kind, n, tensor, args), tensor))
              for n in (1, 2))
  layer = {k: two[k] - one[k] for k in set(one) | set(two)}
  rest = {k: one[k] - layer[k] for k in set(one) | set(layer)}
  common = {"model": kind, "tensor": tensor,
            "layer": {f"{k[0]} {k[1]} {k[2]}": v for k, v in sorted(layer.items(), key=str)
                      if isinstance(k, tuple) and v},
            "rest": {f"{k[0]} {k[1]} {k[2]}": v for k, v in sorted(rest.items(), key=str)
                     if isinstance(k, tuple) and v},
            "in_loop": two["in_loop"]}  # collectives inside `while` bodies (none expected)
  return {**common, "megatron_layer": megatron_layer(kind, tensor, args)}


def megatron_layer(kind: str, tensor: int, args) -> dict:
  """Megatron's collectives per layer (module docstring): two all-reduces of `B x T x d`
  each way; with sequence parallelism each is an all-gather of `B x T x d` and a
  reduce-scatter into `B x T/t x d` (the bytes of one device's part)."""
  if tensor == 1:
    return {}
  activation_bytes = args.batch * args.seq_len * args.d_model * 4
  ops = ({"all-gather": activation_bytes, "reduce-scatter": activation_bytes // tensor}
         if kind.endswith(SEQUENCE_PARALLEL) else {"all-reduce": activation_bytes})
  return {f"{op} {part} {what}": 2 if what == "n" else 2 * nbytes
          for op, nbytes in ops.items() for part in ("fwd", "bwd") for what in ("n", "bytes")}


def _cell(counts: dict, kind: str, parts=("fwd", "bwd")) -> str:
  """`count / KiB` of `kind` over `parts`, "-" for none."""
  n = sum(counts.get(f"{kind} {part} n", 0) for part in parts)
  kib = sum(counts.get(f"{kind} {part} bytes", 0) for part in parts) / 1024
  return f"{n} / {kib:.0f}" if n else "-"


def print_table(rows: list[dict]) -> None:
  print("per layer, then the rest of the step: count / KiB of the arrays (AR all-reduce, AG "
        "all-gather, RS reduce-scatter, CP collective-permute, A2A all-to-all)")
  ops = ("all-reduce", "all-gather", "reduce-scatter")
  heads = [f"{ABBREVIATIONS[op]} {p}" for op in ops for p in ("fwd", "bwd")]
  print(f"{'model':<28} {'tensor':>6} " + " ".join(f"{h:>10}" for h in heads)
        + f" {'CP':>9} {'A2A':>9} {'scalars':>7} {'Megatron fwd':>20} {'Megatron bwd':>20} | "
        f"{'rest AR fwd':>11} {'rest AR bwd':>11} {'rest AG':>9}")
  for r in rows:
    m, layer, rest = r["megatron_layer"], r["layer"], r["rest"]
    megatron = [" + ".join(f"{ABBREVIATIONS[op]} {_cell(m, op, (p,))}" for op in COUNTED
                           if f"{op} {p} n" in m) or "-" for p in ("fwd", "bwd")]
    cells = [_cell(layer, op, (p,)) for op in ops for p in ("fwd", "bwd")]
    print(f"{r['model']:<28} {r['tensor']:>6} " + " ".join(f"{c:>10}" for c in cells)
          + f" {_cell(layer, 'collective-permute'):>9} {_cell(layer, 'all-to-all'):>9}"
          f" {layer.get('all-reduce scalar n', 0):>7}"
          f" {megatron[0]:>20} {megatron[1]:>20} | {_cell(rest, 'all-reduce', ('fwd',)):>11} "
          f"{_cell(rest, 'all-reduce', ('bwd',)):>11} {_cell(rest, 'all-gather'):>9}")


def main(argv=None) -> dict:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--batch", type=int, default=8)
  parser.add_argument("--seq_len", type=int, default=128)
  parser.add_argument("--d_model", type=int, default=256)
  parser.add_argument("--n_heads", type=int, default=8)
  parser.add_argument("--d_ff", type=int, default=1024)
  parser.add_argument("--n_experts", type=int, default=16)
  parser.add_argument("--expert_size", type=int, default=64)
  parser.add_argument("--block_size", type=int, default=32)
  parser.add_argument("--attention_experts", type=int, default=4)
  parser.add_argument("--tensors", default="1,2,4")
  parser.add_argument("--models", default=",".join(MODELS))
  parser.add_argument("--out", default="benchmarks/tensor_parallel_collectives_cpu.json")
  args = parser.parse_args(argv)
  machine = machine_info()
  rows = [row(kind, int(t), args) for kind in args.models.split(",")
          for t in args.tensors.split(",")]
  print_table(rows)
  result = {"machine": machine, "args": vars(args), "rows": rows}
  write_result(result, args.out)
  return result


if __name__ == "__main__":
  main()
