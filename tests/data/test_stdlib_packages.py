"""The `stdlib_packages` TFDS builder and its task through `load_task_split`, on a fake tree."""

import collections
import os

import ml_collections
import numpy as np
import pytest

from sparse_jax.data import builtin, classification, stdlib_packages

PACKAGES = ("alpha", "beta", "gamma")
SNIPPET_BYTES = 16
MAX_SNIPPETS = 4
_FILES_PER_SPLIT = {"train": 3, "validation": 2, "test": 2}


def _pick_names(package: str) -> list[str]:
  """File paths of `package` that `builtin.split_of` spreads over every split."""
  wanted, names = dict(_FILES_PER_SPLIT), []
  for i in range(1000):
    path = os.path.join(package, "sub" if i % 2 else "", f"mod_{i}.py")
    if wanted[builtin.split_of(path)]:
      wanted[builtin.split_of(path)] -= 1
      names.append(path)
  assert not any(wanted.values())
  return names


@pytest.fixture(scope="module")
def fake_stdlib(tmp_path_factory):
  """{relative path: content} of the package files; sizes from below one window to over cap."""
  rng = np.random.default_rng(0)
  files = {}
  for package in PACKAGES:
    for j, path in enumerate(_pick_names(package)):
      size = [5, 40, 3 * SNIPPET_BYTES, 9 * SNIPPET_BYTES + 7, 50, 200, 70][j]
      files[path] = rng.integers(32, 127, size=size).astype(np.uint8).tobytes()
  ignored = {"delta/mod.py": b"d" * 100, "alpha.py": b"a" * 100,
             "alpha/__pycache__/mod_0.py": b"p" * 100, "alpha/notes.txt": b"n" * 100}
  root = tmp_path_factory.mktemp("fake_stdlib")
  for path, content in {**files, **ignored}.items():
    os.makedirs(os.path.dirname(root / path), exist_ok=True)
    (root / path).write_bytes(content)
  return str(root), files


def task(root, data_dir, **overrides):
  return ml_collections.ConfigDict(dict(
      name="stdlib_packages", source_root=root, data_dir=data_dir, packages=PACKAGES,
      snippet_bytes=SNIPPET_BYTES, max_snippets_per_file=MAX_SNIPPETS, max_len=32) | overrides)


@pytest.fixture(scope="module")
def records(fake_stdlib, tmp_path_factory):
  """{split: [(path, label, snippet bytes)]} read straight from the prepared builder."""
  root, _ = fake_stdlib
  builder = stdlib_packages.StdlibPackages(
      source_root=root, packages=PACKAGES, snippet_bytes=SNIPPET_BYTES,
      max_snippets_per_file=MAX_SNIPPETS, data_dir=str(tmp_path_factory.mktemp("tfds")),
      file_format="array_record")
  builder.download_and_prepare()
  result = {}
  for split in stdlib_packages.SPLITS:
    source = builder.as_data_source(split)
    result[split] = [(source[i]["path"].decode(), int(source[i]["label"]),
                      bytes(np.asarray(source[i]["text"]))) for i in range(len(source))]
  return result


def test_snippets_are_capped_evenly_spaced_windows_of_the_right_files(fake_stdlib, records):
  _, files = fake_stdlib
  by_path = collections.defaultdict(list)
  for split, split_records in records.items():
    for path, label, snippet in split_records:
      assert split == builtin.split_of(path)
      assert PACKAGES[label] == path.split(os.sep)[0]
      by_path[path].append(snippet)
  for path, content in files.items():
    windows = [content[k:k + SNIPPET_BYTES]
               for k in range(0, len(content) - SNIPPET_BYTES + 1, SNIPPET_BYTES)]
    snippets = by_path.get(path, [])
    assert len(snippets) == min(len(windows), MAX_SNIPPETS), path
    starts = sorted(windows.index(s) for s in snippets)  # Windows are distinct random bytes.
    assert len(set(starts)) == len(starts)
    if len(windows) > MAX_SNIPPETS:  # One window from each of MAX_SNIPPETS equal blocks.
      block = len(windows) / MAX_SNIPPETS
      assert [int(start // block) for start in starts] == list(range(MAX_SNIPPETS))
  assert set(by_path) == {p for p, c in files.items() if len(c) >= SNIPPET_BYTES}


def test_snippet_starts():
  np.testing.assert_array_equal(stdlib_packages.snippet_starts(50, 16, 4), [0, 16, 32])
  np.testing.assert_array_equal(stdlib_packages.snippet_starts(8 * 10, 10, 4), [0, 20, 40, 60])
  assert len(stdlib_packages.snippet_starts(9, 10, 4)) == 0


def test_settings_and_sources_are_part_of_the_dataset_identity(fake_stdlib, tmp_path):
  root, _ = fake_stdlib

  def data_dir(**kwargs):
    settings = dict(source_root=root, packages=PACKAGES, snippet_bytes=SNIPPET_BYTES,
                    max_snippets_per_file=MAX_SNIPPETS) | kwargs
    return stdlib_packages.StdlibPackages(data_dir=str(tmp_path), **settings).data_dir

  base = data_dir()
  assert base == data_dir()  # Deterministic.
  others = [data_dir(snippet_bytes=32), data_dir(max_snippets_per_file=2),
            data_dir(packages=PACKAGES[:2]), data_dir(packages=PACKAGES[::-1])]
  copy = tmp_path / "copy"
  for path in builtin.list_sources(root):
    os.makedirs(os.path.dirname(copy / path), exist_ok=True)
    (copy / path).write_bytes(open(os.path.join(root, path), "rb").read())
  assert data_dir(source_root=str(copy)) == base  # Same files elsewhere: same records.
  (copy / _pick_names("beta")[0]).write_bytes(b"changed")
  others.append(data_dir(source_root=str(copy)))
  assert len({base, *others}) == len(others) + 1


def test_missing_package_is_named(fake_stdlib, tmp_path):
  root, _ = fake_stdlib
  with pytest.raises(FileNotFoundError, match="epsilon"):
    stdlib_packages.StdlibPackages(source_root=root, packages=("alpha", "epsilon"),
                                   data_dir=str(tmp_path))


def test_load_task_split_and_few_shot_subsets(fake_stdlib, records, tmp_path):
  root, _ = fake_stdlib
  cfg = task(root, str(tmp_path))
  spec = classification.task_spec(cfg)
  assert (spec.num_classes, spec.text_fields, spec.is_bytes) == (3, ("text",), True)
  train = classification.load_task_split(cfg, "train")
  assert [(label, text) for _, label, text in records["train"]] == list(
      zip(train.labels.tolist(), train.texts[0]))
  assert train.labels.dtype == np.int32
  n = len(train) // 2
  subsets = {seed: classification.load_task_split(cfg, "train", n_examples=n, seed=seed)
             for seed in (0, 1)}
  again = classification.load_task_split(cfg, "train", n_examples=n, seed=0)
  assert again.texts == subsets[0].texts
  np.testing.assert_array_equal(again.labels, subsets[0].labels)
  assert subsets[0].texts != subsets[1].texts
  pairs = set(zip(train.texts[0], train.labels.tolist()))
  for subset in subsets.values():
    assert len(subset) == n and len(set(subset.texts[0])) == n
    assert set(zip(subset.texts[0], subset.labels.tolist())) <= pairs
  smaller = classification.load_task_split(cfg, "train", n_examples=3, seed=1)
  assert smaller.texts[0] == subsets[1].texts[0][:3]  # Nested: a prefix of the larger draw.
  for seed in (0, 1):  # The reference's few-shot script: the split's first records, any seed.
    first = classification.load_task_split(cfg, "train", n_examples=n, seed=seed, first=True)
    assert first.texts[0] == train.texts[0][:n]
    np.testing.assert_array_equal(first.labels, train.labels[:n])
  with pytest.raises(ValueError, match="n_examples"):
    classification.load_task_split(cfg, "train", n_examples=len(train) + 1)


def test_task_config_errors_name_the_field(fake_stdlib):
  root, _ = fake_stdlib
  for field, value in [("snippet_bytes", 0), ("max_snippets_per_file", 1.5),
                       ("packages", ("alpha",)), ("source_root", 3)]:
    with pytest.raises(ValueError, match=f"task.{field}"):
      classification.task_spec(task(root, None, **{field: value}))
  with pytest.raises(ValueError, match="split"):
    classification.load_task_split(task(root, None), "dev")
