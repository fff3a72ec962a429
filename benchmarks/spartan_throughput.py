"""CPU throughput and storage of RoBERTa with SPARTAN, Houlsby or Pfeiffer (SPARTAN Tables 1-2).

    python -m benchmarks.spartan_throughput [--preset=base] [--batch=32] [--length=128] \
        [--repeats=10] [--no-finetune] [--out=benchmarks/spartan_throughput_cpu.json]

Inference throughput (Sec. 5, App. F: instances per minute at batch 32 on CPU) of four
variants with random weights: `roberta` (the backbone and task head alone, i.e. the model of
the `head` method; full fine-tuning runs the same graph), `spartan`, `houlsby` and `pfeiffer`
(the plug-ins with the paper's settings, `methods.default_method_config`), and
`spartan_gather`, SPARTAN reading only the chosen parents' children. Each variant's
eval forward is jitted and warmed up (compilation excluded), then the variants take turns
call by call for `--repeats` rounds, so drift in the machine's load hits all of them alike.
Reported: median seconds per batch, instances per minute, and the ratio to `roberta`.

With `--finetune` (the default) a second table times one fine-tuning step (Table 2's
"fine-tune throughput"): forward and backward with respect to the method's trainable
parameters only (dropout on), then an Adam update of those parameters; `roberta` is full
fine-tuning here. The storage columns come from `sparse_jax.finetune.storage.storage_report`
(`roberta`: full fine-tuning, a whole model per task, as in Table 1). Prints markdown tables
and writes JSON with the machine's details.
"""

import argparse
import statistics
import time

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
from flax import nnx

from benchmarks.machine import machine_info, write_result
from sparse_jax.finetune import methods
from sparse_jax.finetune.storage import storage_report
from sparse_jax.models.classifier import SequenceClassifier
from sparse_jax.models.encoder import roberta_base_config

# variant: (method whose model is timed for inference, method whose training and storage
# count, SPARTAN's child read or None). `spartan` reads densely (auto at N_p 16, K 8);
# `spartan_gather` is the same memory reading only the chosen parents' children.
VARIANTS = {"roberta": ("head", "full", None), "spartan": ("spartan", "spartan", "auto"),
            "spartan_gather": ("spartan", "spartan", "gather"),
            "houlsby": ("houlsby", "houlsby", None), "pfeiffer": ("pfeiffer", "pfeiffer", None)}
NUM_CLASSES = 2
LEARNING_RATE = 1e-3


def preset_config(preset: str) -> ml_collections.ConfigDict:
  """RoBERTa-base (`base`) or a toy encoder of the same shape of config (`tiny`)."""
  cfg = roberta_base_config()
  if preset == "tiny":
    cfg.update(vocab_size=100, d_model=32, n_layers=1, n_heads=2)
    cfg.ff.d_ff = 64
  return cfg


def build_model(model_cfg: ml_collections.ConfigDict, method: str,
                read: str | None) -> SequenceClassifier:
  """The classifier of `method` (SPARTAN with child read `read`) with random weights (seed 0)."""
  method_cfg = methods.default_method_config(method)
  if read is not None:
    method_cfg.spartan.read = read
  return SequenceClassifier(methods.with_method(model_cfg, method_cfg), NUM_CLASSES,
                            head_dropout=method_cfg.head_dropout, rngs=nnx.Rngs(0))


def random_batch(vocab_size: int, batch: int, length: int):
  """Full-length random token rows starting with `<s>` (id 0), and binary labels."""
  rng = np.random.default_rng(0)
  tokens_bt = rng.integers(3, vocab_size, (batch, length), dtype=np.int32)
  tokens_bt[:, 0] = 0
  return (jnp.asarray(tokens_bt), jnp.full((batch,), length, jnp.int32),
          jnp.asarray(rng.integers(0, NUM_CLASSES, (batch,), dtype=np.int32)))


def make_inference(model: SequenceClassifier):
  """A closure running one jitted eval forward of `model` (weights bound)."""
  model.eval()
  graphdef, state = nnx.split(model)

  @jax.jit
  def forward(state, tokens_bt, lengths_b):
    logits_bc, _ = nnx.merge(graphdef, state)(tokens_bt, lengths_b)
    return logits_bc

  return lambda batch: forward(state, *batch[:2])


def make_finetune(model: SequenceClassifier, method: str):
  """A closure running one jitted fine-tuning step of `model` training `method`'s part
  (the step's state is carried across calls; `model`'s own arrays are not updated).

  The state splits into trainable parameters, dropout RNG state and everything frozen; the
  gradient is taken with respect to the trainable part only (`nnx.DiffState`) and Adam holds
  state for it only. Only the trainable part and the RNG state come back from the step.
  """
  model.train()
  trainable = methods.trainable_filter(methods.default_method_config(method))
  graphdef, params, rng_state, frozen = nnx.split(model, trainable, nnx.RngState, ...)
  optimizer = optax.adam(LEARNING_RATE)

  def loss_fn(model, tokens_bt, lengths_b, labels_b):
    logits_bc, _ = model(tokens_bt, lengths_b)
    return optax.softmax_cross_entropy_with_integer_labels(logits_bc, labels_b).mean()

  @jax.jit
  def step(params, opt_state, rng_state, frozen, tokens_bt, lengths_b, labels_b):
    model = nnx.merge(graphdef, params, rng_state, frozen)
    grad_fn = nnx.value_and_grad(loss_fn, argnums=nnx.DiffState(0, trainable))
    loss, grads = grad_fn(model, tokens_bt, lengths_b, labels_b)
    updates, opt_state = optimizer.update(grads, opt_state, params)
    return (optax.apply_updates(params, updates), opt_state,
            nnx.state(model, nnx.RngState), loss)

  carry = [params, optimizer.init(params), rng_state]

  def run(batch):
    new_params, opt_state, new_rng_state, loss = step(*carry, frozen, *batch)
    carry[:] = [new_params, opt_state, new_rng_state]
    return loss

  return run


def interleaved_medians(runs: dict, batch, repeats: int) -> dict[str, float]:
  """Median seconds per call of each closure: one warm-up call each, then round-robin."""
  for run in runs.values():
    jax.block_until_ready(run(batch))
  times = {name: [] for name in runs}
  for _ in range(repeats):
    for name, run in runs.items():
      start = time.perf_counter()
      jax.block_until_ready(run(batch))
      times[name].append(time.perf_counter() - start)
  return {name: statistics.median(t) for name, t in times.items()}


def throughput_rows(seconds: dict[str, float], batch_size: int, methods: dict,
                    storage: dict) -> list[dict]:
  """Per variant: seconds per batch, instances per minute, ratio to `roberta`, and the
  storage of the variant's fine-tuning method (`roberta`: full fine-tuning)."""
  base = batch_size * 60 / seconds["roberta"]
  rows = []
  for name, s in seconds.items():
    report = storage[VARIANTS[name][1]]
    per_minute = batch_size * 60 / s
    rows.append({"variant": name, "method": methods[name], "seconds_per_batch": s,
                 "instances_per_minute": per_minute, "x_roberta": per_minute / base,
                 "trainable_params": report["trainable_params"],
                 "bytes_per_task": report["bytes_per_task"],
                 "storage_x_backbone": report["storage_x_backbone"]})
  return rows


def print_table(title: str, rows: list[dict], n_tasks: int) -> None:
  print(f"\n### {title}\n")
  print(f"| variant | method | s/batch | instances/min | x roberta | trainable params "
        f"| MB/task | storage ({n_tasks} tasks) x backbone |")
  print("|---|---|---:|---:|---:|---:|---:|---:|")
  for r in rows:
    print(f"| {r['variant']} | {r['method']} | {r['seconds_per_batch']:.4f} "
          f"| {r['instances_per_minute']:.1f} | {r['x_roberta']:.2f} "
          f"| {r['trainable_params']:,} | {r['bytes_per_task'] / 1e6:.2f} "
          f"| {r['storage_x_backbone']:.2f} |")


def parse_args(argv):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--preset", choices=("base", "tiny"), default="base")
  parser.add_argument("--batch", type=int, default=32)
  parser.add_argument("--length", type=int, default=128)
  parser.add_argument("--repeats", type=int, default=10)
  parser.add_argument("--n_tasks", type=int, default=9, help="Tasks for the storage columns.")
  parser.add_argument("--finetune", action=argparse.BooleanOptionalAction, default=True,
                      help="Also time a fine-tuning step per variant.")
  parser.add_argument("--out", default="benchmarks/spartan_throughput_cpu.json")
  return parser.parse_args(argv)


def time_phase(phase: str, runs: dict, batch, args, storage: dict) -> list[dict]:
  """Times one phase's closures (round-robin), prints its table and returns its rows."""
  methods = {name: VARIANTS[name][phase == "finetune"] for name in runs}
  rows = throughput_rows(interleaved_medians(runs, batch, args.repeats), args.batch, methods,
                         storage)
  print_table(f"{phase} throughput ({args.preset}, batch {args.batch}, length {args.length}, "
              f"median of {args.repeats})", rows, args.n_tasks)
  return rows


def main(argv=None) -> dict:
  args = parse_args(argv)
  model_cfg = preset_config(args.preset)
  batch = random_batch(model_cfg.vocab_size, args.batch, args.length)
  storage = {m: storage_report(model_cfg, methods.default_method_config(m), NUM_CLASSES,
                               args.n_tasks) for m in methods.METHODS}
  result = {"machine": machine_info(), **vars(args), "storage": storage}
  # One model per variant serves both phases: `head` and `full` build the same RoBERTa.
  models = {name: build_model(model_cfg, train_method, read)
            for name, (_, train_method, read) in VARIANTS.items()}
  result["inference"] = time_phase(
      "inference", {name: make_inference(model) for name, model in models.items()}, batch,
      args, storage)
  if args.finetune:
    result["finetune"] = time_phase(
        "finetune", {name: make_finetune(model, VARIANTS[name][1])
                     for name, model in models.items()}, batch, args, storage)
  write_result(result, args.out)
  return result


if __name__ == "__main__":
  main()
