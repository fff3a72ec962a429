"""The Markdown of a `benchmarks.gpu_suite` report, ready to paste into benchmarks/RESULTS.md.

One section per part: a summary line of the GPU tests, a table each for cvmm, the MoE layer,
the training step, where the step's time goes (step_profile), decoding and cvmm side by side
with the authors' kernels. A part that did
not run (or is still running) says so; cells that did not run read "skipped" or "error" and
their reasons are listed under the table.
"""

import collections

from benchmarks import cvmm_side_by_side, quality_small

CVMM_HEADER = [
    "| dtype | d_model | N_E | impl | fwd ms | fwd TFLOP/s | fwd % roofline | fwd x dense "
    "| fwd+bwd ms | fwd+bwd TFLOP/s | fwd+bwd % roofline | fwd+bwd x dense | fwd+bwd peak MiB |",
    "|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
OPS = {"cvmm": "cvmm: the up projection, x [T, d_model] shared by K slots, w [N_E, d_model, G]",
       "moe_layer": "MoE layer: cvmm up, ReLU, gated cvmm down (gradients of x, W1, W2, gates)"}


def number(value, spec: str) -> str:
  return "n/a" if value is None else format(value, spec)


def not_run(part: dict | None) -> str | None:
  """Why a part has nothing to show (None: it has)."""
  if part is None:
    return "Not run."
  if part["status"] == "error":
    return f"Not measured: {part['error'].splitlines()[0]}"
  if part["status"].startswith("skipped"):
    return f"Not measured: {part['status']}."
  return None


def header(report: dict) -> str:
  meta, env = report["meta"], report.get("environment") or {}
  peaks = env.get("peaks")
  peak_text = ("not in benchmarks/roofline.py's table: roofline columns read n/a" if not peaks
               else f"{peaks['name']}: {peaks['tflops']['bfloat16']:g} TFLOP/s bfloat16, "
                    f"{peaks['tflops']['float32']:g} TFLOP/s float32, "
                    f"{peaks['hbm_tb_s']:g} TB/s HBM")
  return "\n".join([
      f"## `benchmarks/gpu_suite.py` on {env.get('device_kind', 'an unknown device')}",
      "",
      f"- Date: {env.get('date', 'n/a')}; jax {env.get('jax', 'n/a')}, jaxlib "
      f"{env.get('jaxlib', 'n/a')}, Python {env.get('python', 'n/a')}; whole run "
      f"{meta.get('elapsed_s', 0):.0f} s (budget {meta['budget_s']:g} s).",
      f"- Peaks: {peak_text}.",
      f"- Command: `{meta['command']}`"])


def tests_line(part: dict | None) -> str:
  """Counts (of the tests that finished, if pytest timed out) and the failing test ids."""
  if part is None or "passed" not in part:
    return f"Tests on the device: {not_run(part)}"
  line = (f"Tests on the device ({', '.join(part['paths'])}): "
          f"{part['passed']} passed, {part['failed']} failed, {part['skipped']} skipped")
  if part["status"] == "error":
    line += f" ({part['error'].splitlines()[0]})"
  return line + (f"; failing: {', '.join(part['failing'])}" if part["failing"] else ".")


def cell_columns(cell: dict | None) -> list[str]:
  """ms, TFLOP/s, % roofline, x dense of one pass (a status word if it did not run)."""
  if cell is None or cell["status"] != "ok":
    status = "-" if cell is None else cell["status"].split(":")[0]
    return [status, "-", "-", "-"]
  fraction = cell["roofline_fraction"]
  return [f"{cell['ms']:.3f}", f"{cell['tflops']:.3g}",
          "n/a" if fraction is None else f"{100 * fraction:.0f}%",
          number(cell["x_dense"], ".2f")]


def cvmm_table(part: dict | None, op: str) -> str:
  """One row per shape and impl (fwd and fwd+bwd side by side), by dtype, d_model, N_E."""
  title = f"### {OPS[op]}"
  reason = not_run(part)
  if reason:
    return f"{title}\n\n{reason}"
  cells = [c for c in part["cells"] if c["op"] == op]
  if not cells:
    return f"{title}\n\nNo cells yet."
  rows = collections.defaultdict(dict)
  for cell in cells:
    rows[cell["dtype"], cell["d_model"], cell["experts"], cell["impl"]][cell["pass"]] = cell
  first = cells[0]
  lines = [title, "", f"T = {first['tokens']} tokens, G = {first['group']}, K = {first['k']}; "
           f"ms per call: median of {part['repeats']} interleaved samples after a warm-up, "
           f"a sample being back-to-back calls lasting >= {part['min_sample_ms']:g} ms; "
           "% roofline = max(FLOPs / peak, bytes / bandwidth) / time.", "", *CVMM_HEADER]
  order = {key: i for i, key in enumerate(rows)}  # impls in the order they ran
  for key in sorted(rows, key=lambda key: (*key[:3], order[key])):
    fwd, fwd_bwd = rows[key].get("fwd"), rows[key].get("fwd_bwd")
    memory = fwd_bwd and fwd_bwd.get("peak_memory_bytes")
    lines.append("| " + " | ".join([*map(str, key), *cell_columns(fwd), *cell_columns(fwd_bwd),
                                    number(memory and memory / 2**20, ".1f")]) + " |")
  return "\n".join(lines + not_run_reasons(cells))


def not_run_reasons(cells: list[dict]) -> list[str]:
  """A bullet per distinct reason cells did not run: the reason, its impls, how many cells."""
  impls, counts = collections.defaultdict(dict), collections.Counter()
  for cell in cells:
    if cell["status"] != "ok":
      reason = cell["error"].splitlines()[0][:300] if cell["status"] == "error" else cell["status"]
      impls[reason][cell["impl"]] = None
      counts[reason] += 1
  if not counts:
    return []
  return ["", "Not measured:"] + [f"- {', '.join(impls[reason])}: {reason} ({count} cells)"
                                  for reason, count in counts.items()]


def training_table(part: dict | None) -> str:
  title = "### Training step (bfloat16 compute, f32 parameters, random tokens, one device)"
  reason = not_run(part)
  if reason:
    return f"{title}\n\n{reason}"
  lines = [title, "", f"ms/step: the mean of {part['steps']} steps run as training runs "
           "them (each dispatched while the one before computes); synced: the median of as "
           "many steps each waited for (host dispatch included). After a warm-up step. \"x "
           "baseline\": the comparison's first model's ms/step over this one's.", "",
           "| comparison | model | params | batch x seq_len | ms/step | synced ms/step | tokens/s "
           "| x baseline | MFU | compile s | peak memory GiB |",
           "|---|---|---:|---|---:|---:|---:|---:|---:|---:|---:|"]
  for row in part["rows"]:
    shape = f"{row['batch_size']} x {row['seq_len']}"
    if row["status"] != "ok":
      status = row["status"] if row["status"] != "error" else f"error: {row['error'][:200]}"
      lines.append(f"| {row['comparison']} | {row['model']} | - | {shape} | {status} | - | - "
                   "| - | - | - | - |")
      continue
    memory = row["peak_memory_bytes"]
    model = row["model"] + (f" (= {row['same_model_as']})" if "same_model_as" in row else "")
    lines.append(f"| {row['comparison']} | {model} | {row['params']:,} | {shape} | "
                 f"{row['step_ms']:.1f} | {number(row.get('synced_step_ms'), '.1f')} | "
                 f"{row['tokens_per_second']:.0f} | "
                 f"{number(row.get('x_baseline'), '.2f')} | "
                 f"{number(row.get('mfu'), '.1%')} | "
                 f"{number(row.get('compile_s'), '.0f')} | "
                 f"{number(memory and memory / 2**30, '.2f')} |")
  return "\n".join(lines)


STEP_PROFILE_TOP = 5  # kernels per model in the Markdown (the JSON holds step_profile.TOP)


def step_profile_table(part: dict | None) -> str:
  """Device ms/step per category, one column per model, the kernels' sum beside the
  measured step; then each model's top kernels."""
  title = "### Where the training step's time goes (benchmarks/step_profile.py)"
  reason = not_run(part)
  if reason:
    return f"{title}\n\n{reason}"
  models = [m for m in part["models"] if m["status"] == "ok"]
  lines = [title, "", f"Device time per step of {part['steps']} traced steps (after a warm-up "
           "step and as many timed ones), by category; share of the kernels' sum in brackets."]
  if models:
    labels = {c["category"]: c["label"] for c in models[0]["categories"]}
    lines += ["", "| category | " + " | ".join(m["model"] for m in models) + " |",
              "|---|" + "---:|" * len(models)]
    for key, label in labels.items():
      cells = []
      for m in models:
        c = next(c for c in m["categories"] if c["category"] == key)
        cells.append(f"{c['ms']:.2f} ({100 * c['share']:.0f}%)")
      lines.append(f"| {label} | " + " | ".join(cells) + " |")
    lines.append("| **kernels' sum** | " + " | ".join(f"{m['total']['ms']:.2f}" for m in models)
                 + " |")
    lines.append("| **measured step (wall)** | "
                 + " | ".join(f"{m['total']['wall_ms']:.2f}" for m in models) + " |")
    lines.append("| idle between kernels (largest gap) | " + " | ".join(
        _idle_cell(m.get("idle")) for m in models) + " |")
    lines += ["", f"Top {STEP_PROFILE_TOP} kernels of each model (x floor: the time over its "
              "launches' roofline floor; tiles: the GEMM tiling XLA chose):", "",
              "| model | kernel | category | calls/step | ms/step | x floor | shapes | tiles |",
              "|---|---|---|---:|---:|---:|---|---|"]
    for m in models:
      for k in m["top"][:STEP_PROFILE_TOP]:
        launch = k.get("launch") or {}
        floor = launch.get("floor_ms")
        over = f"{k['ms'] / (k['calls'] * floor):.1f}" if floor and k["calls"] else "-"
        lines.append(f"| {m['model']} | `{k['name'][:70]}` | {k['category']} | "
                     f"{k['calls']:.0f} | {k['ms']:.3f} | {over} | {launch.get('shapes', '')} | "
                     f"{launch.get('tiles', '')} |")
  others = [m for m in part["models"] if m["status"] != "ok"]
  if others:
    lines += ["", "Not measured:"] + [
        f"- {m['model']}: {m['status'] if m['status'] != 'error' else m['error'][:300]}"
        for m in others]
  return "\n".join(lines)


def _idle_cell(idle: dict | None) -> str:
  """`ms/step (largest gap ms)` of `step_profile.idle_gaps`, '-' without one."""
  if not idle:
    return "-"
  largest = idle["largest"][0]["ms"] if idle["largest"] else 0.0
  return f"{idle['ms']:.2f} ({largest:.2f})"


def decode_table(part: dict | None) -> str:
  title = "### Decoding one token (benchmarks/decode.py)"
  reason = not_run(part)
  if reason:
    return f"{title}\n\n{reason}"
  settings = ", ".join(f"{key} {value}" for key, value in part["settings"].items())
  lines = [title, "", f"{settings}.", "", "| variant | block ms | x dense | model ms | x dense |",
           "|---|---:|---:|---:|---:|"]
  for row in part["rows"]:
    lines.append(f"| {row['variant']} | {row['block_ms']:.3f} | {row['block_speedup']:.2f} | "
                 f"{row['model_ms']:.3f} | {row['model_speedup']:.2f} |")
  return "\n".join(lines)


def side_by_side_table(part: dict | None) -> str:
  """Our cvmm beside the dense-equivalent probe and their kernels
  (`cvmm_side_by_side.format_table`)."""
  title = "### cvmm side by side with the authors' kernels (benchmarks/cvmm_side_by_side.py)"
  reason = not_run(part)
  return f"{title}\n\n{reason or cvmm_side_by_side.format_table(part)}"


def quality_table(part: dict | None) -> str:
  """The quality part's runs: bits per byte per corpus and variant over seeds, and each
  variant's paired difference to dense (`quality_small.format_table`)."""
  title = "### quality runs (benchmarks/quality_small.py)"
  reason = not_run(part)
  if reason:
    return f"{title}\n\n{reason}"
  return (f"{title}\n\n`{part['command']}`: {part['runs']} runs finished\n\n"
          f"{quality_small.format_table(part['summary'])}")


def markdown(report: dict) -> str:
  """The whole report as Markdown."""
  cvmm = report.get("cvmm")
  return "\n\n".join([header(report), tests_line(report.get("tests")),
                      cvmm_table(cvmm, "cvmm"), cvmm_table(cvmm, "moe_layer"),
                      training_table(report.get("training")),
                      step_profile_table(report.get("step_profile")),
                      decode_table(report.get("decode")),
                      side_by_side_table(report.get("side_by_side")),
                      quality_table(report.get("quality"))]) + "\n"
