"""benchmarks/gpu_suite.py --smoke runs end to end and its derived numbers agree with the
shapes (its timings are not checked here)."""

import itertools
import json

import jax
import jax.numpy as jnp
import pytest

from benchmarks import decode, gpu_suite, gpu_suite_tables, roofline, step_profile

MEASURED_IMPLS = ("dense", "pallas", "blocked", "ragged")
# A budget no run reaches, so that how fast the machine is decides nothing; the budget's
# logic is tested with a budget of 0.
NO_LIMIT_S = "1e9"
no_gpu = pytest.mark.skipif(jax.default_backend() == "gpu", reason="checks the CPU behaviour")




def active_flops(cell: dict) -> int:
  """A cell's FLOPs from its shape: dense multiplies by all N_E * G units, the MoE by K * G;
  the layer has two projections; forward + backward is three times the forward."""
  units = cell["group"] * (cell["experts"] if cell["impl"] == "dense" else cell["k"])
  projections = 1 if cell["op"] == "cvmm" else 2
  passes = 3 if cell["pass"] == "fwd_bwd" else 1
  return 2 * cell["tokens"] * cell["d_model"] * units * projections * passes


def check_every_part_is_recorded(out, report):
  assert list(report) == ["meta", "environment", "tests", "cvmm", "training", "step_profile",
                          "decode", "side_by_side", "quality"]
  assert report["side_by_side"] == report["quality"] == {"status": "skipped: --parts"}
  assert report["tests"]["status"] == "skipped: smoke"
  assert all(report[part]["status"] == "ok"
             for part in ("environment", "cvmm", "training", "step_profile", "decode"))
  assert report["meta"]["command"] == (
      f"python -m benchmarks.gpu_suite --smoke --out {out} --budget_s {NO_LIMIT_S}")
  assert report["environment"]["jax"] == jax.__version__


def check_cvmm_and_layer_cells_are_timed_and_consistent(out, report):
  cells = {(c["op"], c["impl"], c["pass"], c["dtype"]): c for c in report["cvmm"]["cells"]}
  no_peaks = report["environment"]["peaks"] is None
  for op, impl, pass_, dtype in itertools.product(("cvmm", "moe_layer"), MEASURED_IMPLS,
                                                  gpu_suite.PASSES, gpu_suite.SMOKE.dtypes):
    cell = cells[op, impl, pass_, dtype]
    dense = cells[op, "dense", pass_, dtype]
    assert cell["status"] == "ok", cell
    assert cell["ms"] > 0 and cell["peak_memory_bytes"] > 0
    assert cell["flops"] == active_flops(cell)
    assert cell["tflops"] == pytest.approx(active_flops(cell) / (cell["ms"] * 1e-3) / 1e12)
    assert cell["x_dense"] == pytest.approx(dense["ms"] / cell["ms"])
    x_bytes = cell["tokens"] * cell["d_model"] * jnp.dtype(dtype).itemsize
    assert cell["bytes"] > x_bytes
    if no_peaks:
      assert cell["roofline_us"] is None and cell["roofline_fraction"] is None


def check_mosaic_cells_are_recorded_errors_on_cpu(out, report):
  mosaic = [c for c in report["cvmm"]["cells"] if c["impl"] == "mosaic"]
  assert len(mosaic) == 2 * len(gpu_suite.PASSES) * len(gpu_suite.SMOKE.dtypes)
  assert all(c["status"] == "error" and "mosaic" in c["error"] for c in mosaic)


def check_training_and_decode_rows(out, report):
  rows = report["training"]["rows"]
  assert [(r["comparison"], r["model"]) for r in rows] == [
      (comparison, name) for comparison, models in gpu_suite.TRAINING.items()
      for name, *_ in models]
  kinds = {r["model"]: (r["attention"], r["ff"]["kind"]) for r in rows}
  assert kinds["sigma_moe wt103_s"] == ("xl", "sigma_moe")
  assert kinds["sigma_moe wt103_s xla attention"] == ("xl", "sigma_moe")
  assert {r["model"] for r in rows if r["attention_impl"] == "xla"} == {
      "dense wt103_s xla attention", "sigma_moe wt103_s xla attention"}
  assert kinds["switchhead wt103_s"] == ("switchhead_xl", "dense")
  assert kinds["moeut 44m"] == ("switchhead", "sigma_moe")
  cudnn = [r for r in rows if r["attention_core"] == "cudnn"]
  assert [r["model"] for r in cudnn] == ["moeut 44m cudnn", "dense 44m cudnn"]
  for row in cudnn:  # cuDNN's kernels run only on a GPU: a recorded error here, whose
    # wording is the installed JAX plugin's (none: "cuDNN is not detected"), not ours.
    assert row["status"] == "error" and row["error"].strip(), row
  rows = [r for r in rows if r not in cudnn]
  for row in rows:
    assert row["status"] == "ok" and row["dtype"] == "bfloat16" and row["step_ms"] > 0
    tokens = row["batch_size"] * row["seq_len"]
    assert row["tokens_per_second"] == pytest.approx(tokens / (row["step_ms"] * 1e-3))
    assert row["compile_s"] > 0 and row["model_tflop_per_step"] > 0
    peaks = roofline.device_peaks(jax.devices()[0].device_kind)
    assert row["mfu"] == (peaks and pytest.approx(
        row["model_tflop_per_step"] / (row["step_ms"] * 1e-3) / peaks.tflops["bfloat16"]))
    baseline = next(r for r in rows if r["comparison"] == row["comparison"])
    assert row["x_baseline"] == pytest.approx(baseline["step_ms"] / row["step_ms"])
  # The two papers' WT-103 S dense baselines are one model, timed once.
  same = {r["model"]: r.get("same_model_as") for r in rows}
  assert same == {**{r["model"]: None for r in rows},
                  "dense 10 heads wt103_s": "dense wt103_s",
                  "dense wt103_s unrolled": "dense wt103_s",
                  "dense 44m unrolled": "dense 44m", "moeut 44m xla core": "moeut 44m",
                  # Shrunk alike for the smoke run (`test_aligned_widths_rows`: not at size).
                  "dense wt103_s widths 412/2053": "dense wt103_s",
                  "dense wt103_s widths 416/2056": "dense wt103_s",
                  "sigma_moe wt103_s width 412": "sigma_moe wt103_s",
                  "sigma_moe wt103_s width 416": "sigma_moe wt103_s",
                  "dense wt103_s threefry": "dense wt103_s"}
  assert {r["model"]: r["rng_impl"] for r in rows if r["comparison"] == "dropout_rng"} == {
      "dense wt103_s threefry": "threefry", "dense wt103_s rbg": "rbg",
      "dense wt103_s unsafe_rbg": "unsafe_rbg"}
  assert {r["model"] for r in rows if r["scan_layers"]} == {
      "dense wt103_s scanned", "sigma_moe wt103_s scanned", "moeut 44m scanned"}
  step_ms = {r["model"]: r["step_ms"] for r in rows}
  assert step_ms["dense 10 heads wt103_s"] == step_ms["dense wt103_s"]
  assert [r["variant"] for r in report["decode"]["rows"]] == list(decode.VARIANTS)


def check_step_profile_breaks_down_the_training_parts_steps(out, report):
  models = report["step_profile"]["models"]
  assert [m["model"] for m in models] == list(gpu_suite.STEP_PROFILE)
  for model in models:
    assert model["status"] == "ok" and model["mode"] == "device", model
    assert model["compiled_by"] == "training part"  # not compiled a second time
    categories = model["categories"]
    assert [c["category"] for c in categories] == list(step_profile.CATEGORIES)
    assert sum(c["ms"] for c in categories) == pytest.approx(model["total"]["ms"])
    assert sum(c["share"] for c in categories) == pytest.approx(1.0)
    assert model["total"]["ms"] > 0 and model["total"]["wall_ms"] > 0
    assert model["top"] and all(k["ms"] > 0 for k in model["top"])
    assert model["idle"]["ms"] >= 0 and model["top"][0]["launch"]["shapes"]
  by_model = {m["model"]: {c["category"]: c["ms"] for c in m["categories"]} for m in models}
  assert by_model["sigma_moe wt103_s"]["moe"] > 0 and by_model["dense wt103_s"]["moe"] == 0
  assert by_model["switchhead wt103_s"]["moe"] > 0
  assert all(ms["attention"] > 0 and ms["optimizer"] > 0 for ms in by_model.values())


def check_markdown_holds_every_table(out, report):
  markdown = (out / "gpu_suite.md").read_text()
  assert markdown.count(gpu_suite_tables.CVMM_HEADER[0]) == 2
  assert "| dense 10 heads wt103_s (= dense wt103_s) |" in markdown
  for title in ("### Training step", "### Where the training step's time goes",
                "| **measured step (wall)** |", "| idle between kernels (largest gap) |",
                "### Decoding one token",
                "Tests on the device: Not measured: skipped: smoke"):
    assert title in markdown


def test_one_smoke_run_records_every_part_consistently(tmp_path):
  """One smoke run (it takes a minute) checked part by part."""
  out = tmp_path
  report = gpu_suite.main(["--smoke", "--out", str(out), "--budget_s", NO_LIMIT_S])
  assert json.loads((out / "gpu_suite.json").read_text()) == json.loads(json.dumps(report))
  check_every_part_is_recorded(out, report)
  check_cvmm_and_layer_cells_are_timed_and_consistent(out, report)
  if jax.default_backend() != "gpu":
    check_mosaic_cells_are_recorded_errors_on_cpu(out, report)
  check_training_and_decode_rows(out, report)
  check_step_profile_breaks_down_the_training_parts_steps(out, report)
  check_markdown_holds_every_table(out, report)


def test_no_cell_starts_after_the_time_budget_and_parts_left_out_are_skipped(tmp_path):
  report = gpu_suite.main(["--smoke", "--budget_s", "0", "--out", str(tmp_path),
                           "--parts=cvmm,training,decode", "--training=moeut"])
  assert report["tests"] == {"status": "skipped: --parts"}
  assert report["step_profile"] == {"status": "skipped: --parts"}
  assert [r["comparison"] for r in report["training"]["rows"]] == ["moeut", "moeut"]
  assert report["cvmm"]["cells"]
  assert {c["status"] for c in report["cvmm"]["cells"]} == {"skipped: time budget"}
  assert {r["status"] for r in report["training"]["rows"]} == {"skipped: time budget"}
  assert report["decode"]["status"] == "skipped: time budget"
  assert "skipped" in (tmp_path / "gpu_suite.md").read_text()


def test_step_profile_alone_compiles_within_its_share_and_skips_past_it(tmp_path):
  """Without the training part, step_profile compiles its models itself, while its share
  lasts (budget 0: none)."""
  report = gpu_suite.main(["--smoke", "--budget_s", "0", "--out", str(tmp_path),
                           "--parts=step_profile"])
  assert report["training"] == {"status": "skipped: --parts"}
  assert {m["status"] for m in report["step_profile"]["models"]} == {"skipped: time budget"}
  assert "skipped: time budget" in (tmp_path / "gpu_suite.md").read_text()


def test_side_by_side_runs_only_when_asked_and_reports_ours_beside_the_probe(tmp_path):
  """Left out of the default parts; asked for, it times our cvmm beside the dense-equivalent
  probe (their kernels need PyTorch and CUDA: skipped here with the reason) and its table is
  in the Markdown."""
  assert "side_by_side" not in gpu_suite.parse_args(["--out", str(tmp_path)]).parts
  report = gpu_suite.main(["--smoke", "--out", str(tmp_path), "--parts=side_by_side",
                           "--theirs", str(tmp_path / "none"), "--budget_s", NO_LIMIT_S])
  part = report["side_by_side"]
  assert part["status"] == "ok" and report["cvmm"] == {"status": "skipped: --parts"}
  ours = [r for r in part["rows"] if r["framework"] == "jax" and r["impl"] != "probe"]
  assert ours and all(r["status"] == "ok" and r["x_probe"] > 0 for r in ours)
  theirs = [r for r in part["rows"] if r["framework"] == "torch"]
  assert theirs and all(r["status"].startswith("skipped: ") for r in theirs)
  assert (tmp_path / "cvmm_side_by_side.json").is_file()
  assert "side by side with the authors' kernels" in (tmp_path / "gpu_suite.md").read_text()


@pytest.mark.parametrize("flag", ["--parts=tests,training,speed", "--training=moeut,gpt"])
def test_unknown_parts_and_comparisons_are_refused(tmp_path, flag, capsys):
  with pytest.raises(SystemExit):
    gpu_suite.main(["--smoke", "--out", str(tmp_path), flag])
  assert f"{flag.split('=')[0]}: unknown" in capsys.readouterr().err


@no_gpu
def test_without_a_gpu_it_asks_for_smoke(tmp_path):
  with pytest.raises(SystemExit, match="no GPU found: run with --smoke"):
    gpu_suite.main(["--out", str(tmp_path)])


def test_quality_part_trains_on_the_carried_corpus_in_a_subprocess(tmp_path, monkeypatch):
  """The quality part runs `benchmarks.quality_small` on corpora staged as for a GPU node
  (`--stage_corpora`): the runs read the staged TFDS dataset instead of preparing one from
  this Python, record their config, and land in DIR/quality.json and the Markdown."""
  from benchmarks import quality_small
  staged = tmp_path / "carried"
  quality_small.main([f"--stage_corpora={staged}", "--corpora=builtin"])
  assert (staged / "tensorflow_datasets" / "builtin").is_dir()
  home = tmp_path / "home"  # TFDS's default folder would be here: the run must not need it.
  monkeypatch.setenv("HOME", str(home))
  out = tmp_path / "out"
  report = gpu_suite.main(["--smoke", "--out", str(out), "--budget_s", NO_LIMIT_S,
                           "--parts=quality", f"--quality_data={staged}"])
  part = report["quality"]
  assert part["status"] == "ok" and part["returncode"] == 0 and part["runs"] == 1, part
  [run] = json.loads((out / "quality.json").read_text())["runs"]
  assert (run["variant"], run["steps"], run["config_fields"]["model.embed_init"]) == (
      "dense", 2, "fan_in")
  assert (staged / "quality_small" / "builtin" / "dense" / "seed0" / "result.json").exists()
  assert not (home / "tensorflow_datasets").exists()  # the staged dataset was read
  assert "### quality runs" in (out / "gpu_suite.md").read_text()


def test_aligned_widths_rows():
  """At size, the aligned rows are the WT-103 S models at d_model 416 (and d_ff 2056), their
  baselines the paper's 412 (and 2053); nothing else of the models differs."""
  rows = {name: config.model for _, name, config in gpu_suite.training_configs(
      ["aligned_widths"], smoke=False)}
  widths = {name: (model.d_model, model.ff.get("d_ff")) for name, model in rows.items()}
  assert widths == {"dense wt103_s widths 412/2053": (412, 2053),
                    "dense wt103_s widths 416/2056": (416, 2056),
                    "sigma_moe wt103_s width 412": (412, None),
                    "sigma_moe wt103_s width 416": (416, None)}
  for paper, aligned in (("dense wt103_s widths 412/2053", "dense wt103_s widths 416/2056"),
                         ("sigma_moe wt103_s width 412", "sigma_moe wt103_s width 416")):
    models = [rows[paper].to_dict(), rows[aligned].to_dict()]
    for model in models:
      model.update(d_model=None)
      model["ff"].pop("d_ff", None)
    assert models[0] == models[1]


def test_dropout_rng_rows_differ_only_in_the_prng():
  """At size, the three rows are the dense WT-103 S step with each `train.rng_impl`: one
  model, one batch, three keys (`model_key`), so none is mistaken for another."""
  rows = gpu_suite.training_configs(["dropout_rng"], smoke=False)
  assert [config.train.get("rng_impl", "threefry") for *_, config in rows] == [
      "threefry", "rbg", "unsafe_rbg"]
  keys = [gpu_suite.model_key(config) for *_, config in rows]
  assert len(set(keys)) == 3 and len({key[0] for key in keys}) == 1
  for *_, config in rows:
    config.train.rng_impl = "threefry"
  assert len({gpu_suite.model_key(config) for *_, config in rows}) == 1


def test_roofline_bound_is_the_slower_of_compute_and_memory():
  h100 = roofline.device_peaks("NVIDIA H100 80GB HBM3")
  assert roofline.bound_us(h100, "bfloat16", flops=989e9, num_bytes=1e6) == pytest.approx(1e3)
  assert roofline.bound_us(h100, "float32", flops=1e6, num_bytes=3.35e9) == pytest.approx(1e3)
  assert roofline.bound_us(roofline.device_peaks("cpu"), "float32", 1e6, 1e6) is None


def test_junit_counts_skip_the_test_cut_short(tmp_path):
  xml = tmp_path / "tests.xml"
  xml.write_text(
      '<testsuites><testsuite><testcase classname="t" name="a"/>'
      '<testcase classname="t" name="b"><failure message="x"/></testcase>'
      '<testcase classname="t" name="c"><error message="x"/></testcase>'
      '<testcase classname="t" name="d"><skipped message="x"/></testcase>'
      '<testcase time="0.0"/></testsuite></testsuites>')
  assert gpu_suite.junit_counts(xml) == {"passed": 1, "failed": 2, "skipped": 1,
                                         "failing": ["t::b", "t::c"]}
