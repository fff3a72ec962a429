"""Time and memory of one MLP / MoE layer against the swept size (sigma-MoE Fig. 2, 6, 7).

Reads `benchmarks/cvmm.py` JSON: each row is one (impl, shape) with the forward + backward
time and peak memory; the sweep variable is N_E (Fig. 2), G (Fig. 6) or d_model (Fig. 7), as
the file's rows say. As in the paper, full lines are time and dashed lines memory, one colour
per impl (dense = the parameter-matched MLP).
"""

import json

from sparse_jax.figures import output

_SWEEPS = {"experts": "N_E (experts)", "group": "G (expert size)", "d_model": "d_model"}


def _rows(path: str) -> list[dict]:
  with open(path, encoding="utf-8") as f:
    saved = json.load(f)
  if not isinstance(saved, dict) or "rows" not in saved or "meta" not in saved or not all(
      {"impl", "fwd_bwd_ms"} <= set(row) for row in saved["rows"]):
    raise ValueError(f"{path} is not the JSON of benchmarks/cvmm.py (needs 'meta' and 'rows' "
                     f"with 'impl' and 'fwd_bwd_ms').")
  return [dict(row, sweep=row.get("sweep", "experts")) for row in saved["rows"]]


def compute_cvmm_scaling(json_paths: list[str]) -> dict:
  """`{"sweep": variable, "impls": {impl: {"x": [...], "fwd_bwd_ms": [...],
  "fwd_bwd_memory_mb": [...]}}}`, points sorted by the swept value; the files must share one
  sweep variable."""
  rows = [row for path in json_paths for row in _rows(path)]
  sweeps = sorted({row["sweep"] for row in rows})
  if len(sweeps) != 1:
    raise ValueError(f"the files sweep different variables {sweeps}; plot one at a time.")
  sweep = sweeps[0]
  impls: dict[str, dict[str, list]] = {}
  for row in sorted(rows, key=lambda r: r[sweep]):
    series = impls.setdefault(row["impl"], {"x": [], "fwd_bwd_ms": [], "fwd_bwd_memory_mb": []})
    series["x"].append(row[sweep])
    series["fwd_bwd_ms"].append(row["fwd_bwd_ms"])
    series["fwd_bwd_memory_mb"].append(row.get("fwd_bwd_memory_mb"))
  return {"sweep": sweep, "files": list(json_paths), "impls": impls}


def plot_cvmm_scaling(numbers: dict):
  fig, (ax,) = output.new_figure(width=6.0)
  impls = sorted(numbers["impls"].items())
  with_memory = [(i, impl, s) for i, (impl, s) in enumerate(impls)
                 if all(m is not None for m in s["fwd_bwd_memory_mb"])]
  for i, (impl, series) in enumerate(impls):
    ax.plot(series["x"], series["fwd_bwd_ms"], "-o", color=f"C{i}", label=f"{impl} time")
  if with_memory:  # older benchmark files have no memory column
    memory_ax = ax.twinx()
    for i, impl, series in with_memory:
      memory_ax.plot(series["x"], series["fwd_bwd_memory_mb"], "--", color=f"C{i}")
    memory_ax.set_ylabel("peak memory (MB, dashed)")
  xs = sorted({x for _, series in impls for x in series["x"]})
  ax.set_xscale("log", base=2)
  ax.set_xticks(xs, [str(x) for x in xs])
  ax.set_xlabel(_SWEEPS[numbers["sweep"]])
  ax.set_ylabel("forward + backward (ms" + (", full lines)" if with_memory else ")"))
  ax.legend(fontsize="small", loc="upper left")
  return fig


def make_cvmm_scaling(json_paths: list[str], out_dir: str, *,
                      name: str = "cvmm_scaling") -> dict[str, str]:
  """Computes (`compute_cvmm_scaling`), plots and saves."""
  numbers = compute_cvmm_scaling(json_paths)
  return output.save(plot_cvmm_scaling(numbers), numbers, out_dir, name)
