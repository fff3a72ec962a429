"""Memory of a paper config's training step per device under each precision, rematerialisation
and accumulation setting, compiled for an accelerator on this machine (`--compile_only`).

    pip install -e ".[compile]"
    python -m benchmarks.train_memory --target=h100 --config=sigma_moe_paper.py:wt103_b \
        [--out=benchmarks/train_memory_wt103_b.json]

Each row is one `compile_task` of the config with `model.dtype`, `model.remat` and
`train.grad_accum_steps` set as named (at the config's own batch, or `--batch_size`):
what XLA allocates for the training step (arguments, outputs, temporaries), the peak with
evaluation, whether it fits one device, and the compile time here. Compiled, not run.
"""

import argparse
import json
import tempfile

from benchmarks import compile_targets
from sparse_jax.aot import targets

# (model.dtype, model.remat, train.grad_accum_steps), the first the config as written.
SETTINGS = (("float32", "none", 1), ("bfloat16", "none", 1), ("float32", "block", 1),
            ("bfloat16", "block", 1), ("bfloat16", "dots", 1), ("bfloat16", "none", 2),
            ("bfloat16", "none", 4), ("bfloat16", "block", 4))


def rows(target_name: str, config: str, settings, batch_size: int | None = None):
  target = targets.parse_target(target_name)
  with tempfile.TemporaryDirectory() as roberta_dir:
    for dtype, remat, accum in settings:
      overrides = {"model.dtype": dtype, "model.remat": remat, "train.grad_accum_steps": accum}
      row = compile_targets.config_row(target, config, roberta_dir, batch_size,
                                       overrides=overrides)
      row.update(dtype=dtype, remat=remat, grad_accum_steps=accum)
      print(f"  {dtype} remat={remat} accum={accum}: "
            f"{row.get('train_gib', row.get('error'))}", flush=True)
      yield row


def markdown(table: list[dict]) -> str:
  lines = ["| batch | model.dtype | model.remat | grad_accum_steps | training step GiB "
           "| peak GiB | fits | compile s |", "|---:|---|---|---:|---:|---:|---|---:|"]
  for r in table:
    if not r["compiled"]:
      lines.append(f"| {r['batch_size']} | {r['dtype']} | {r['remat']} | "
                   f"{r['grad_accum_steps']} | {r['error']} | | no | |")
      continue
    lines.append(f"| {r['batch_size']} | {r['dtype']} | {r['remat']} | "
                 f"{r['grad_accum_steps']} | {r['train_gib']:.2f} | {r['peak_gib']:.2f} | "
                 f"{'yes' if r['fits'] else 'no'} | {r['compile_seconds']:.0f} |")
  return "\n".join(lines)


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--target", default="h100")
  parser.add_argument("--config", default="sigma_moe_paper.py:wt103_b")
  parser.add_argument("--settings", help="dtype:remat:accum,... (default: the module's)")
  parser.add_argument("--batch_size", type=int, help="default: the config's")
  parser.add_argument("--out", default="benchmarks/train_memory.json")
  args = parser.parse_args()
  settings = SETTINGS if not args.settings else [
      (d, r, int(a)) for d, r, a in (s.split(":") for s in args.settings.split(","))]
  table = list(rows(args.target, args.config, settings, args.batch_size))
  print(markdown(table))
  with open(args.out, "w", encoding="utf-8") as f:
    json.dump({"target": args.target, "config": args.config, "rows": table}, f, indent=1)
  print(f"wrote {args.out}")


if __name__ == "__main__":
  main()
