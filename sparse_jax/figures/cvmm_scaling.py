"""Time and memory of one MLP / MoE layer against the swept size (sigma-MoE Fig. 2, 6, 7).

Reads `benchmarks/cvmm.py` JSON: each row is one (impl, shape) with the forward and the
forward + backward time and peak memory; the sweep variable is N_E (Fig. 2), G (Fig. 6) or
d_model (Fig. 7), as the rows say. One panel for the forward, one for forward + backward; as
in the paper, full lines are time and dashed lines memory, one colour per impl (dense = the
parameter-matched MLP). Files written before the sweeps and the memory columns existed are
read as sweeps over N_E without memory (their G and d_model are in `meta`).

Several files make one figure only if they measured the same setting (tokens, K, dtype,
device and the two sizes not swept) and no (impl, value) twice: different settings or two
measurements of one point would draw lines that mean nothing.
"""

import json

from sparse_jax.figures import output

_SWEEPS = {"experts": "N_E (experts)", "group": "G (expert size)", "d_model": "d_model"}
_SIZES = ("experts", "group", "d_model")
_SERIES = ("fwd_ms", "fwd_bwd_ms", "fwd_memory_mb", "fwd_bwd_memory_mb")
_PANELS = (("fwd", "forward"), ("fwd_bwd", "forward + backward"))


def _load(path: str) -> dict:
  """The JSON of `path`, checked to be benchmarks/cvmm.py output: {"meta": {...}, "rows":
  [one dict per (impl, shape)]}."""
  with open(path, encoding="utf-8") as f:
    try:
      saved = json.load(f)
    except json.JSONDecodeError as e:
      raise ValueError(f"{path} is not JSON ({e}).") from e
  rows = saved.get("rows") if isinstance(saved, dict) else None
  if not (isinstance(saved, dict) and isinstance(saved.get("meta"), dict) and rows
          and all(isinstance(r, dict) and {"impl", "fwd_ms", "fwd_bwd_ms"} <= set(r)
                  for r in rows)):
    raise ValueError(f"{path} is not the JSON of benchmarks/cvmm.py (needs 'meta' and "
                     f"non-empty 'rows' with 'impl', 'fwd_ms' and 'fwd_bwd_ms').")
  return saved


def _rows(path: str) -> list[dict]:
  """The rows of one file, each completed with its sweep, sizes, setting and file: older
  files have no `sweep`, memory, G or d_model in their rows (the sizes are in `meta`)."""
  saved = _load(path)
  meta = saved["meta"]
  rows = []
  for row in saved["rows"]:
    row = {"sweep": "experts", "fwd_memory_mb": None, "fwd_bwd_memory_mb": None,
           **{size: meta.get(size) for size in ("group", "d_model")}, **row, "file": path}
    fixed = {size: row[size] for size in _SIZES if size != row["sweep"]}
    row["setting"] = dict(fixed, **{key: meta.get(key)
                                    for key in ("tokens", "k", "dtype", "device")})
    rows.append(row)
  return rows


def _check_comparable(rows: list[dict]) -> None:
  """Raises ValueError unless the rows share one sweep variable and one setting, and no
  (impl, swept value) is measured twice."""
  sweeps = sorted({row["sweep"] for row in rows})
  if len(sweeps) != 1:
    raise ValueError(f"the files sweep different variables {sweeps}; plot one at a time.")
  settings = {json.dumps(row["setting"], sort_keys=True): row["file"] for row in rows}
  if len(settings) != 1:
    raise ValueError("the files measured different settings: " + "; ".join(
        f"{path}: {setting}" for setting, path in settings.items()))
  seen = {}
  for row in rows:
    point = (row["impl"], row[row["sweep"]])
    if point in seen:
      raise ValueError(f"impl {point[0]!r} at {row['sweep']}={point[1]} is measured in both "
                       f"{seen[point]} and {row['file']}; plot them separately.")
    seen[point] = row["file"]


def compute_cvmm_scaling(json_paths: list[str]) -> dict:
  """The series of the figure from benchmarks/cvmm.py JSON files.

  Returns {"sweep": variable, "setting": the fixed sizes and tokens/K/dtype/device,
  "files": json_paths, "impls": {impl: {"x": swept values, ascending, "fwd_ms": [...],
  "fwd_bwd_ms": [...], "fwd_memory_mb": [...], "fwd_bwd_memory_mb": [...]}}}, the lists
  aligned with "x"; memory is None where the file has none. Impls in order of first
  appearance (dense first, as the benchmark writes it).
  """
  rows = [row for path in json_paths for row in _rows(path)]
  _check_comparable(rows)
  sweep = rows[0]["sweep"]
  impls = {row["impl"]: {"x": [], **{key: [] for key in _SERIES}} for row in rows}
  for row in sorted(rows, key=lambda r: r[sweep]):
    impls[row["impl"]]["x"].append(row[sweep])
    for key in _SERIES:
      impls[row["impl"]][key].append(row[key])
  return {"sweep": sweep, "setting": rows[0]["setting"], "files": list(json_paths),
          "impls": impls}


def _plot_panel(ax, numbers: dict, phase: str, title: str) -> None:
  """One phase ("fwd" or "fwd_bwd"): time per impl in full lines on `ax`, memory dashed on a
  second y axis (only for impls whose every point has a memory value)."""
  impls = list(numbers["impls"].items())
  for i, (impl, series) in enumerate(impls):
    ax.plot(series["x"], series[f"{phase}_ms"], "-o", color=f"C{i}", label=impl)
  with_memory = [(i, s) for i, (_, s) in enumerate(impls)
                 if all(m is not None for m in s[f"{phase}_memory_mb"])]
  if with_memory:
    memory_ax = ax.twinx()
    for i, series in with_memory:
      memory_ax.plot(series["x"], series[f"{phase}_memory_mb"], "--", color=f"C{i}")
    memory_ax.set_ylabel("peak memory (MB, dashed)")
  xs = sorted({x for _, series in impls for x in series["x"]})
  ax.set_xscale("log", base=2)
  ax.set_xticks(xs, [str(x) for x in xs])
  ax.set_xlabel(_SWEEPS[numbers["sweep"]])
  ax.set_ylabel("time (ms" + (", full lines)" if with_memory else ")"))
  ax.set_title(title)
  ax.legend(fontsize="small", loc="upper left")


def plot_cvmm_scaling(numbers: dict):
  """Two panels, forward and forward + backward, with the fixed setting as the title."""
  fig, axes = output.new_figure(2, width=5.5)
  for ax, (phase, title) in zip(axes, _PANELS):
    _plot_panel(ax, numbers, phase, title)
  fig.suptitle(", ".join(f"{key}={value}" for key, value in numbers["setting"].items()),
               fontsize="small")
  return fig


def make_cvmm_scaling(json_paths: list[str], out_dir: str, *,
                      name: str = "cvmm_scaling") -> dict[str, str]:
  """Computes (`compute_cvmm_scaling`), plots and saves."""
  numbers = compute_cvmm_scaling(json_paths)
  return output.save(plot_cvmm_scaling(numbers), numbers, out_dir, name)
