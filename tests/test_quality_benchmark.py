"""benchmarks/quality_small.py's bookkeeping (seeds, error bars, resuming) and its prose corpus,
without training: `train_to_completion` is replaced by a stub that records its calls."""

import hashlib
import json
import os

import numpy as np
import pytest

from benchmarks import prose_corpus, quality_small
from sparse_jax.configs import quality_medium, sigma_moe_paper, wt103_s_dense, wt103_s_embedded
from sparse_jax.models.accounting import model_report
from sparse_jax.tasks.runs import RunInterrupted


def _run(corpus, variant, seed, bpb):
  return {"corpus": corpus, "variant": variant, "seed": seed, "valid_bits_per_byte": bpb,
          "params": 1000}


def test_summary_is_mean_and_sd_over_seeds_and_the_paired_difference_to_dense():
  dense, moe = [2.56, 2.55, 2.54], [2.59, 2.60, 2.61]
  runs = [_run("prose", "dense", s, b) for s, b in enumerate(dense)]
  runs += [_run("prose", "sigma_moe", s, b) for s, b in enumerate(moe)]
  rows = {r["variant"]: r for r in quality_small.summarise(runs)}
  np.testing.assert_allclose([rows["dense"]["bpb_mean"], rows["dense"]["bpb_sd"]],
                             [np.mean(dense), np.std(dense, ddof=1)])
  diffs = 100 * (np.array(moe) / np.array(dense) - 1)
  np.testing.assert_allclose(
      [rows["sigma_moe"]["diff_percent_mean"], rows["sigma_moe"]["diff_percent_sd"]],
      [diffs.mean(), diffs.std(ddof=1)])
  assert rows["dense"]["diff_percent_mean"] is None
  table = quality_small.format_table(list(rows.values()))
  assert f"{np.mean(moe):.4f} +- {np.std(moe, ddof=1):.4f}" in table


def test_a_finished_run_is_read_back_not_redone(tmp_path, monkeypatch):
  calls = []

  def fake_train(config, workdir):
    calls.append((config.seed, config.model.ff.kind, workdir))
    os.makedirs(workdir, exist_ok=True)
    with open(os.path.join(workdir, "metrics.jsonl"), "w") as f:
      f.write(json.dumps({"step": 10, "split": "train", "tokens_per_second": 1000.0}) + "\n")
    return {"bits_per_byte": 2.5 + config.seed}

  monkeypatch.setattr(quality_small, "train_to_completion", fake_train)
  args = ["--variants=dense,sigma_moe", "--seeds=0,1", "--steps=10",
          f"--workdir={tmp_path}", f"--out={tmp_path / 'out.json'}"]
  first = quality_small.main(args)
  assert [(seed, kind) for seed, kind, _ in calls] == [
      (0, "dense"), (0, "sigma_moe"), (1, "dense"), (1, "sigma_moe")]
  assert calls[3][2] == str(tmp_path / "quality_small" / "builtin" / "sigma_moe" / "seed1")
  data = quality_small.variant_config("quality_small", "dense").data
  run_s = data.batch_size * data.seq_len * 10 / 1000.0  # 10 steps at the logged rate
  assert [r["run_s"] for r in first["runs"]] == pytest.approx([run_s] * 4)
  second = quality_small.main(args)
  assert len(calls) == 4 and second["runs"] == first["runs"]
  assert json.loads((tmp_path / "out.json").read_text())["summary"] == second["summary"]


def test_an_interrupted_run_is_not_recorded(tmp_path, monkeypatch):
  def stopped(config, workdir):
    raise RunInterrupted(f"the run in {workdir} was stopped at step 3")

  monkeypatch.setattr(quality_small, "train_to_completion", stopped)
  with pytest.raises(RunInterrupted):
    quality_small.main(["--variants=dense", f"--workdir={tmp_path}",
                        f"--out={tmp_path / 'out.json'}"])
  assert not (tmp_path / "quality_small" / "builtin" / "dense" / "seed0" /
              quality_small.RESULT_FILE).exists()
  assert not (tmp_path / "out.json").exists()


def test_runs_recorded_in_the_json_carry_over_to_a_fresh_workdir(tmp_path, monkeypatch):
  """The JSON is written after each finished run; a later invocation with an empty workdir
  trains only what the JSON does not record, and refuses a JSON of other runs."""
  calls = []

  def train_then_stop(config, workdir):
    calls.append((config.seed, config.model.ff.kind))
    if len(calls) == 2:
      raise RunInterrupted("stopped")
    os.makedirs(workdir, exist_ok=True)
    with open(os.path.join(workdir, "metrics.jsonl"), "w") as f:
      f.write(json.dumps({"step": 10, "split": "train", "tokens_per_second": 1000.0}) + "\n")
    return {"bits_per_byte": 2.0 + len(calls)}

  monkeypatch.setattr(quality_small, "train_to_completion", train_then_stop)
  out = tmp_path / "out.json"
  out.write_text(json.dumps({"rows": [], "steps": 1000}))  # The first format: replaced.
  args = ["--variants=dense,sigma_moe", "--steps=10", f"--out={out}"]
  with pytest.raises(RunInterrupted):
    quality_small.main(args + [f"--workdir={tmp_path / 'first'}"])
  assert [r["variant"] for r in json.loads(out.read_text())["runs"]] == ["dense"]
  result = quality_small.main(args + [f"--workdir={tmp_path / 'fresh'}"])
  assert calls == [(0, "dense"), (0, "sigma_moe"), (0, "sigma_moe")]
  assert [r["valid_bits_per_byte"] for r in result["runs"]] == [3.0, 5.0]
  assert json.loads(out.read_text())["runs"] == result["runs"]
  with pytest.raises(SystemExit, match="recorded with 10 steps, not 20"):
    quality_small.main(["--variants=dense", "--steps=20", f"--out={out}",
                        f"--workdir={tmp_path / 'fresh'}"])
  with pytest.raises(SystemExit, match="records runs of \\['quality_small'\\]"):
    quality_small.main(["--config=quality_medium", f"--out={out}"])


def test_runs_on_a_superseded_corpus_version_are_dropped_and_trained_again(
    tmp_path, monkeypatch, capsys):
  """A prose run recorded before the corpus's current version (no `corpus_id`, as version 1
  wrote them) is not reused: the run trains again in the current version's folder."""
  calls = []

  def fake_train(config, workdir):
    calls.append((config.data.validation_file, workdir))
    os.makedirs(workdir, exist_ok=True)
    with open(os.path.join(workdir, "metrics.jsonl"), "w") as f:
      f.write(json.dumps({"step": 10, "split": "train", "tokens_per_second": 1000.0}) + "\n")
    return {"bits_per_byte": 1.5}

  monkeypatch.setattr(quality_small, "train_to_completion", fake_train)
  monkeypatch.setattr(prose_corpus, "SOURCE_GLOB", _help_files(tmp_path / "doc"))
  out = tmp_path / "out.json"
  old = {**_run("prose", "dense", 0, 0.7), "config": "quality_small", "steps": 10}
  builtin = {**old, "corpus": "builtin", "corpus_id": "builtin"}
  out.write_text(json.dumps({"runs": [old, builtin]}))
  result = quality_small.main(["--variants=dense", "--steps=10", "--corpora=builtin,prose",
                               f"--workdir={tmp_path / 'runs'}", f"--out={out}"])
  assert "dropping 1 runs on a superseded corpus version" in capsys.readouterr().out
  [(validation_file, workdir)] = calls
  assert validation_file == str(tmp_path / "runs" / "prose_v2" / "validation.txt")
  assert workdir == str(tmp_path / "runs" / "quality_small" / "prose_v2" / "dense" / "seed0")
  assert [(r["corpus"], r.get("corpus_id"), r["valid_bits_per_byte"])
          for r in result["runs"]] == [("builtin", "builtin", 0.7), ("prose", "prose_v2", 1.5)]


def _stub_train(calls):
  def train(config, workdir):
    calls.append((config.seed, config.model.embed_init))
    os.makedirs(workdir, exist_ok=True)
    with open(os.path.join(workdir, "metrics.jsonl"), "w") as f:
      f.write(json.dumps({"step": 10, "split": "train", "tokens_per_second": 1000.0}) + "\n")
    return {"bits_per_byte": 2.0}
  return train


def test_runs_record_their_config_and_one_recorded_with_another_is_refused(
    tmp_path, monkeypatch):
  """Each run records its config with every default filled in; a run recorded with another
  value of a field it records (a default changed since, or another --set) is not reused."""
  calls = []
  monkeypatch.setattr(quality_small, "train_to_completion", _stub_train(calls))
  out = tmp_path / "out.json"
  args = ["--variants=dense", "--steps=10", f"--out={out}"]
  first = quality_small.main(args + [f"--workdir={tmp_path / 'a'}",
                                     "--set=model.embed_init=normal", "--set=train.lr=5e-4"])
  [run] = first["runs"]
  assert calls == [(0, "normal")]
  assert (tmp_path / "a" / "quality_small" / "builtin" /
          "dense+model.embed_init=normal+train.lr=0.0005" / "seed0" / "result.json").exists()
  assert run["config_fields"]["model.embed_init"] == "normal"
  assert run["config_fields"]["train.lr"] == 5e-4
  assert run["config_fields"]["model.layer_norm_eps"] == 1e-6  # a default, filled in
  assert not any(path.startswith("data.data_dir") for path in run["config_fields"])
  with pytest.raises(SystemExit, match=r"model.embed_init 'normal' \(now 'fan_in'\).*--out"):
    quality_small.main(args + [f"--workdir={tmp_path / 'a'}", "--set=train.lr=5e-4"])
  out.unlink()
  folder = tmp_path / "a" / "quality_small" / "builtin"  # a result put where another run goes
  (folder / "dense+model.embed_init=normal+train.lr=0.0005").rename(folder / "dense")
  with pytest.raises(SystemExit, match=r"model.embed_init 'normal' \(now 'fan_in'\).*--workdir"):
    quality_small.main(args + [f"--workdir={tmp_path / 'a'}"])
  (folder / "dense").rename(folder / "dense+model.embed_init=normal+train.lr=0.0005")
  again = quality_small.main(args + [f"--workdir={tmp_path / 'a'}", "--set=model.embed_init=normal",
                                     "--set=train.lr=0.0005"])
  assert again["runs"] == first["runs"] and len(calls) == 1
  with pytest.raises(SystemExit, match="PATH=VALUE"):
    quality_small.main(args + ["--set=model.embed_init"])


def test_runs_in_processes_yield_every_call_with_its_result():
  calls = [(2, 3), (3, 2), (5, 1)]
  assert sorted(quality_small.in_processes(pow, calls, jobs=2)) == [
      ((2, 3), 8), ((3, 2), 9), ((5, 1), 5)]
  assert list(quality_small.in_processes(pow, calls, jobs=1)) == [
      ((2, 3), 8), ((3, 2), 9), ((5, 1), 5)]


def test_unknown_variants_and_corpora_are_refused():
  with pytest.raises(SystemExit, match="--corpora must be a comma-separated subset"):
    quality_small.main(["--corpora=wiki"])
  with pytest.raises(SystemExit, match="--variants must be"):
    quality_small.main(["--config=quality_medium", "--variants=switch"])


def _help_files(docs, n=60):
  """`n` help files named `f<i>.txt` holding `text <i>`, plus files that are not prose."""
  docs.mkdir()
  for i in range(n):
    (docs / f"f{i}.txt").write_text(f"text {i}\n\n")
  for name in ("version9.txt", "todo.txt", "index.txt", "usr_toc.txt"):
    (docs / name).write_text("Patch 9.0.0001\n")
  return str(docs / "*.txt")


def test_prose_corpus_splits_whole_prose_files_by_a_hash_of_their_names(tmp_path):
  pattern = _help_files(tmp_path / "doc")
  paths = prose_corpus.prepare(str(tmp_path / "out"), pattern)
  texts = {split: open(path).read() for split, path in paths.items()}
  assert "Patch" not in "".join(texts.values())
  held = {split: [i for i in range(60) if f"text {i}\n" in text]
          for split, text in texts.items()}
  assert sorted(sum(held.values(), [])) == list(range(60))  # Each file in exactly one split.
  for split, numbers in held.items():
    expected = [i for i in range(60)
                if {0: "validation", 1: "test"}.get(
                    int(hashlib.sha256(f"f{i}.txt".encode()).hexdigest(), 16) % 20,
                    "train") == split]
    assert numbers == expected and numbers, split
  assert texts["validation"] == "".join(f"text {i}\n\n" for i in held["validation"])
  overrides = prose_corpus.data_overrides(paths)
  assert overrides["name"] == "text_files" and overrides["test_file"] == paths["test"]


def test_prose_corpus_is_written_once_and_refuses_an_empty_split(tmp_path):
  pattern = _help_files(tmp_path / "doc")
  paths = prose_corpus.prepare(str(tmp_path / "out"), pattern)
  (tmp_path / "doc" / "f0.txt").write_text("changed\n")
  assert prose_corpus.prepare(str(tmp_path / "out"), pattern) == paths
  assert "changed" not in "".join(open(p).read() for p in paths.values())
  few = tmp_path / "few"
  few.mkdir()
  (few / "usr_01.txt").write_text("one\n")
  with pytest.raises(prose_corpus.MissingCorpusError, match="split empty"):
    prose_corpus.prepare(str(tmp_path / "out_few"), str(few / "*.txt"))


def test_prose_corpus_writers_side_by_side_do_not_collide(tmp_path, monkeypatch):
  """A second run prepares the corpus while the first is about to rename its first file in
  place: both succeed, the corpus is whole and no temporary file is left."""
  out, pattern = str(tmp_path / "out"), _help_files(tmp_path / "doc")
  rename = os.replace

  def rename_after_another_writer(src, dst):
    monkeypatch.setattr(os, "replace", rename)
    assert prose_corpus.prepare(out, pattern)["train"] == dst
    rename(src, dst)

  monkeypatch.setattr(os, "replace", rename_after_another_writer)
  paths = prose_corpus.prepare(out, pattern)
  assert open(paths["train"]).read().startswith("text ")
  assert sorted(os.listdir(os.path.join(out, prose_corpus.CORPUS_ID))) == [
      "test.txt", "train.txt", "validation.txt"]


def test_missing_prose_sources_name_the_package(tmp_path):
  with pytest.raises(prose_corpus.MissingCorpusError, match="vim-runtime"):
    prose_corpus.prepare(str(tmp_path), str(tmp_path / "nothing" / "*.txt"))


def test_quality_medium_dense_twin_is_parameter_matched_within_one_percent():
  moe, dense = (model_report(quality_medium.get_config(v).model)["total_params"]
                for v in ("sigma_moe", "dense"))
  assert abs(dense / moe - 1) < 0.01
  ff = quality_medium.get_config().model.ff
  assert (ff.n_experts, ff.expert_size, ff.k) == (16, 128, 4)


def test_wt103_s_embedded_trains_the_papers_wt103_s_pair_on_bytes():
  """The models are the paper configs' but for the byte vocabulary and bfloat16 compute; each
  keeps its paper training (Adam at 2.5e-4, its own clipping), on the embedded data."""
  papers = {"sigma_moe": sigma_moe_paper.get_config("wt103_s"),
            "dense": wt103_s_dense.get_config()}
  for variant in wt103_s_embedded.VARIANTS:
    config = quality_small.variant_config("wt103_s_embedded", variant)
    paper = papers[variant]
    assert config.model.to_dict() == {**paper.model.to_dict(), "vocab_size": 256,
                                      "dtype": "bfloat16"}
    assert (config.data.name, config.data.batch_size, config.data.seq_len) == (
        "builtin", paper.data.batch_size, paper.data.seq_len)
    assert (config.train.lr, config.train.grad_clip, config.train.warmup_steps) == (
        paper.train.lr, paper.train.grad_clip, 0)
    assert config.train.steps == config.train.eval_every == wt103_s_embedded.STEPS
  moe, dense = (model_report(wt103_s_embedded.get_config(v).model)["total_params"]
                for v in ("sigma_moe", "dense"))
  assert abs(dense / moe - 1) < 0.003
