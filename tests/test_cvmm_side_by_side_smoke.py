"""benchmarks/cvmm_side_by_side.py on the CPU at tiny shapes: ours and the JAX probe are timed
and written; the probe's matmul FLOPs are the op's routed FLOPs; without their sources (or
torch, or CUDA) every torch row reads "skipped: <why>"; staging extracts exactly the listed
files from git mirrors (timings are not checked here)."""

import json
import pathlib
import subprocess

import jax.numpy as jnp
import numpy as np
import pytest

from benchmarks import cvmm_side_by_side as sbs
from benchmarks import machine

REPO = pathlib.Path(__file__).resolve().parents[1]
TOKENS, D_MODEL, GROUP, K, EXPERTS = 64, 32, 16, 2, 4
SMALL = [f"--tokens={TOKENS}", f"--d_models={D_MODEL}", f"--experts={EXPERTS}",
         f"--group={GROUP}", f"--k={K}", "--check_tokens=16", "--check_experts=4",
         "--repeats=2", "--min_sample_ms=0", "--budget_s=1e9"]  # No run reaches it.


@pytest.fixture(scope="module")
def run(tmp_path_factory):
  """One run with --theirs at an empty folder: (the JSON written, its path)."""
  folder = tmp_path_factory.mktemp("side_by_side")
  (folder / "theirs").mkdir()
  output = folder / "out.json"
  sbs.main([*SMALL, f"--theirs={folder / 'theirs'}", f"--output={output}"])
  return json.loads(output.read_text()), output


def rows_of(result, framework):
  return [r for r in result["rows"] if r["framework"] == framework]


def test_ours_and_the_probe_are_timed_and_written(run):
  result, _ = run
  assert {"machine", "settings", "probe_definition", "goals", "rows", "checks",
          "workers", "elapsed_s"} <= set(result)
  assert result["machine"]["load_average_end"]
  assert result["settings"]["impl"] == "blocked"
  jax_rows = rows_of(result, "jax")
  probes = {(r["op"], r["pass"]): r for r in jax_rows if r["impl"] == "probe"}
  ours = [r for r in jax_rows if r["impl"] == "blocked"]
  assert len(probes) == 4 and len(ours) == 4
  for row in jax_rows:
    assert row["status"] == "ok", row
    assert row["ms"] > 0 and row["calls_per_sample"] >= 1
    assert row["tflops"] == pytest.approx(row["routed_flops"] / (row["ms"] * 1e-3) / 1e12)
  for row in ours:
    probe = probes[row["op"], row["pass"]]
    assert row["experts"] == probe["experts"] == EXPERTS
    assert row["x_probe"] == pytest.approx(row["ms"] / probe["ms"])
    assert row["x_probe_jax"] == row["x_probe"]
    if row["pass"] == "fwd_bwd":
      assert row["goal_x_probe"] == sbs.GOALS[row["op"]]
      assert row["meets_goal"] == (row["x_probe"] <= sbs.GOALS[row["op"]])
  ours_check = result["checks"][0]
  assert ours_check["impl"] == "ours (blocked)" and ours_check["status"] == "ok", ours_check
  assert set(ours_check["max_rel_err"]["up"]) == {"y", "dx", "dw"}
  assert set(ours_check["max_rel_err"]["down"]) == {"y", "dh", "dw", "dgates"}


def test_the_probe_does_the_ops_routed_matmul_flops(run):
  result, _ = run
  for row in rows_of(result, "jax"):
    expected = 2 * TOKENS * K * D_MODEL * GROUP * (3 if row["pass"] == "fwd_bwd" else 1)
    assert row["routed_flops"] == expected
    if row["impl"] == "probe":
      assert row["matmul_flops"] == expected


def test_matmul_flops_counts_every_dot_in_the_jaxpr():
  a, b = jnp.ones((3, 4)), jnp.ones((4, 5))
  batched = jnp.ones((2, 3, 4)), jnp.ones((2, 4, 5))
  assert sbs.matmul_flops(jnp.dot, a, b) == 2 * 3 * 4 * 5
  assert sbs.matmul_flops(lambda x, y: jnp.einsum("bij,bjk->bik", x, y), *batched) \
      == 2 * 2 * 3 * 4 * 5
  assert sbs.matmul_flops(lambda x: jnp.tanh(x) * 2, a) == 0


def test_every_torch_row_is_skipped_with_a_reason(run):
  result, _ = run
  torch_rows = rows_of(result, "torch")
  per_impl = {name: [r for r in torch_rows if r["impl"] == name] for name in sbs.WORKERS}
  assert len(per_impl["probe_torch"]) == 4
  for name in sbs.THEIRS:
    assert len(per_impl[name]) == 4
    assert all("not found" in r["status"] and "--stage_theirs" in r["status"]
               for r in per_impl[name])
  for row in torch_rows:
    assert row["status"].startswith("skipped: ") and len(row["status"]) > len("skipped: ") + 5
    assert "ms" not in row
  checks = {c["impl"]: c for c in result["checks"]}
  assert all(checks[name]["status"].startswith("skipped: ") for name in sbs.THEIRS)


def test_without_cuda_the_workers_say_so(tmp_path, monkeypatch):
  """A torch that sees no GPU (a stand-in package): each worker starts, says why, and every
  one of its rows and checks carries that."""
  fake = tmp_path / "fake"
  for package, source in (("torch", "class cuda:\n  is_available = staticmethod(lambda: False)\n"),
                          ("triton", "__version__ = '0'\n")):
    (fake / package).mkdir(parents=True)
    (fake / package / "__init__.py").write_text(source)
  monkeypatch.syspath_prepend(str(fake))
  monkeypatch.setenv("PYTHONPATH", str(fake))
  theirs = tmp_path / "theirs"
  for name in sbs.THEIRS:
    (theirs / name).mkdir(parents=True)
  args = sbs.parse_args([*SMALL, f"--theirs={theirs}", "--impl=blocked"])
  inputs = sbs.check_inputs(args)
  (tmp_path / "logs").mkdir()
  rows, workers, checks = sbs.theirs_rows(args, sbs.Clock(60.0, 0.0), tmp_path / "logs", inputs)
  assert {r["impl"] for r in rows} == set(sbs.WORKERS) and len(rows) == 16
  assert all(r["status"] == "skipped: torch sees no CUDA device" for r in rows), rows
  assert all(w["status"] == "skipped: torch sees no CUDA device" and w["returncode"] == 0
             for w in workers.values()), workers
  assert [c["impl"] for c in checks] == list(sbs.THEIRS)
  assert all(c["status"] == "skipped: torch sees no CUDA device" for c in checks)


def test_the_reference_agrees_with_a_brute_force_einsum():
  inputs = sbs.make_inputs(1, 8, 6, 5, 2, 3)
  w_up = inputs["w_up"][inputs["sel"]]  # [T, K, d, G]
  w_down = inputs["w_down"][inputs["sel"]]  # [T, K, G, d]
  up = sbs.reference_up(inputs["x"], inputs["sel"], inputs["w_up"], inputs["ct_up"])
  np.testing.assert_allclose(up["y"], np.einsum("td,tkdg->tkg", inputs["x"], w_up), rtol=1e-5)
  np.testing.assert_allclose(up["dx"], np.einsum("tkg,tkdg->td", inputs["ct_up"], w_up),
                             rtol=1e-5)
  down = sbs.reference_down(inputs["h"], inputs["sel"], inputs["gates"], inputs["w_down"],
                            inputs["ct_down"])
  np.testing.assert_allclose(
      down["y"], np.einsum("tk,tkg,tkgd->td", inputs["gates"], inputs["h"], w_down), rtol=1e-5)
  np.testing.assert_allclose(
      down["dgates"], np.einsum("tkg,tkgd,td->tk", inputs["h"], w_down, inputs["ct_down"]),
      rtol=1e-5)
  assert (np.sort(inputs["sel"], axis=1)[:, 1:] != np.sort(inputs["sel"], axis=1)[:, :-1]).all()


def test_the_table_and_the_json(run):
  result, output = run
  table = sbs.format_table(result)
  assert "| op | d_model | N_E | pass | probe (JAX) | ours (blocked) |" in table
  assert table.count(f"| {D_MODEL} | {EXPERTS} |") == 4
  assert "| ours (blocked) | ok |" in table
  assert "Not timed:" in table and "- probe_torch: skipped: " in table
  rewritten = output.with_name("again.json")
  result["machine"].pop("load_average_end")
  machine.write_result(result, str(rewritten))
  assert json.loads(rewritten.read_text())["rows"] == result["rows"]


def _git(*args, cwd):
  subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=cwd,
                 check=True, capture_output=True)


def test_stage_theirs_extracts_the_listed_files_from_mirrors(tmp_path):
  mirrors = tmp_path / "mirrors"
  for repo, paths in sbs.SOURCES.values():
    work = tmp_path / "work" / repo
    work.mkdir(parents=True)
    for path in paths:
      target = work / path / "mod.py" if "." not in pathlib.Path(path).name else work / path
      target.parent.mkdir(parents=True, exist_ok=True)
      target.write_text(f"# {repo} {path}\n")
    (work / "not_needed.py").write_text("")
    _git("init", "-q", cwd=work)
    _git("add", "-A", cwd=work)
    _git("commit", "-q", "-m", "x", cwd=work)
    _git("clone", "-q", "--bare", str(work), str(mirrors / repo.replace("/", "+") / "repo"),
         cwd=tmp_path)
  dest = tmp_path / "third_party"
  sources = sbs.stage_theirs(str(dest), str(mirrors))
  assert json.loads((dest / "SOURCES.json").read_text()) == sources
  for name, (repo, paths) in sbs.SOURCES.items():
    assert sources[name]["repo"] == repo and len(sources[name]["commit"]) == 40
    assert not (dest / name / "not_needed.py").exists()
    for path in paths:
      assert (dest / name / path).exists(), (name, path)
  assert (dest / "moe_layer" / "triton_src" / "moe_layer" / "mod.py").exists()
  assert sbs.theirs_skip_reason("moe_layer", str(dest)) in (
      None, "skipped: torch is not installed", "skipped: triton is not installed")


def test_staged_sources_are_never_committed():
  ignored = subprocess.run(["git", "check-ignore", "-q", "third_party/cvmm_codex/cvmm.py"],
                           cwd=REPO)
  assert ignored.returncode == 0


def test_suite_part_keeps_to_its_budget_and_writes_its_json(tmp_path):
  part = sbs.suite_part(tmp_path / "suite", 0.0, smoke=True)
  assert set(part) == {"settings", "rows", "checks", "workers", "sources"}
  assert json.loads((tmp_path / "suite" / "cvmm_side_by_side.json").read_text())["rows"] \
      == part["rows"]
  assert all(r["status"] == "skipped: time budget" for r in rows_of(part, "jax"))
  assert all(r["status"].startswith("skipped: ") for r in rows_of(part, "torch"))
  assert part["workers"]["moe_layer"]["status"] == "skipped: no --theirs directory given"
