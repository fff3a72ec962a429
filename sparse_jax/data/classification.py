"""Classification tasks by name: GLUE and the offline `stdlib_packages`, as in-memory splits.

SPARTAN is fine-tuned and evaluated on the nine GLUE tasks (the paper's App. C names the
metrics); `stdlib_packages` is an offline stand-in that needs no download (see
`sparse_jax.data.stdlib_packages`). `task_spec` describes a task and validates the `task`
config section without touching files; `load_task_split` prepares the task's TFDS records
(once: later calls find them in `data_dir`) and returns one split's texts and labels, or a
deterministic random subset of it (the paper's few-shot setting fine-tunes on 200 examples).

`task` config fields: `name` (one of `TASKS`), `data_dir` (None: the TFDS default);
GLUE only: `download` (default True; False refuses to download and needs prepared records);
`stdlib_packages` only: `source_root` (None: this Python's library), `snippet_bytes`
(default 256), `max_snippets_per_file` (default 64) and `packages` (default
`stdlib_packages.DEFAULT_PACKAGES`).

GLUE is read with TFDS's own `glue.Glue` builder (its real download code; the TFDS name
lookup `tfds.builder("glue/rte")` needs TensorFlow, the class does not). GLUE's test splits
are unlabelled: their labels are -1 (classification) or -1.0 (STS-B), so they can be predicted
but not scored here.
"""

import dataclasses

import ml_collections
import numpy as np
import tensorflow_datasets as tfds
from tensorflow_datasets.text import glue

from sparse_jax import validation
from sparse_jax.data import stdlib_packages

STDLIB_TASK = "stdlib_packages"
# GLUE config -> (record fields holding the texts, number of classes; 1 is regression).
_GLUE = {
    "cola": (("sentence",), 2),
    "sst2": (("sentence",), 2),
    "mrpc": (("sentence1", "sentence2"), 2),
    "qqp": (("question1", "question2"), 2),
    "stsb": (("sentence1", "sentence2"), 1),
    "mnli": (("premise", "hypothesis"), 3),
    "qnli": (("question", "sentence"), 2),
    "rte": (("sentence1", "sentence2"), 2),
    "wnli": (("sentence1", "sentence2"), 2),
}
# Metrics logged per GLUE config (names of `training.classification_metrics.METRICS`).
_GLUE_METRICS = {
    "cola": ("matthews_corrcoef", "accuracy"),
    "mrpc": ("accuracy", "f1"),
    "qqp": ("accuracy", "f1"),
    "stsb": ("pearson", "spearman", "pearson_spearman"),
}
_SPLITS = ("train", "validation", "test")
_MNLI_SPLITS = ("train", "validation_matched", "validation_mismatched", "test_matched",
                "test_mismatched")
TASKS = (STDLIB_TASK,) + tuple(f"glue/{config}" for config in _GLUE)


@dataclasses.dataclass(frozen=True)
class TaskSpec:
  """What a task's examples are and how it is scored."""

  name: str  # "stdlib_packages" or "glue/<config>", e.g. "glue/rte".
  num_classes: int  # 1 means regression (glue/stsb).
  text_fields: tuple[str, ...]  # The record fields holding the 1 or 2 input texts.
  metrics: tuple[str, ...]  # Names in `classification_metrics.METRICS`.
  eval_split: str  # "validation" (glue/mnli: "validation_matched").
  is_bytes: bool  # Texts are raw bytes (stdlib) rather than str (GLUE).
  splits: tuple[str, ...] = _SPLITS  # The split names `load_task_split` accepts.


@dataclasses.dataclass(frozen=True)
class ClassificationSplit:
  """A split in memory: one list of texts per text field, and the labels."""

  texts: tuple[list, ...]  # Per text field, N texts (str for GLUE, bytes for stdlib).
  labels: np.ndarray  # [N] int32 class ids, or float32 scores for regression.

  def __len__(self) -> int:
    return len(self.labels)


def _optional_str(cfg: ml_collections.ConfigDict, field: str) -> None:
  value = cfg.get(field)
  validation.require(value is None or isinstance(value, str), f"task.{field}",
                     "None or a path", value)


def _stdlib_settings(cfg: ml_collections.ConfigDict) -> dict:
  """Validated `StdlibPackages` arguments from the task config."""
  _optional_str(cfg, "source_root")
  snippet_bytes = cfg.get("snippet_bytes", stdlib_packages.DEFAULT_SNIPPET_BYTES)
  validation.require_positive_int(snippet_bytes, "task.snippet_bytes")
  max_snippets = cfg.get("max_snippets_per_file",
                         stdlib_packages.DEFAULT_MAX_SNIPPETS_PER_FILE)
  validation.require_positive_int(max_snippets, "task.max_snippets_per_file")
  packages = tuple(cfg.get("packages") or stdlib_packages.DEFAULT_PACKAGES)
  validation.require(
      len(packages) >= 2 and len(set(packages)) == len(packages)
      and all(isinstance(p, str) and p.isidentifier() for p in packages),
      "task.packages", "at least two distinct package names", packages)
  return dict(source_root=cfg.get("source_root"), packages=packages,
              snippet_bytes=snippet_bytes, max_snippets_per_file=max_snippets)


def _glue_download(cfg: ml_collections.ConfigDict) -> bool:
  download = cfg.get("download", True)
  validation.require(isinstance(download, bool), "task.download", "True or False", download)
  return download


def task_spec(task_cfg: ml_collections.ConfigDict) -> TaskSpec:
  """The spec of `task_cfg.name`, after checking the task's config fields (no file access)."""
  name = task_cfg.get("name")
  validation.require_choice(name, "task.name", TASKS)
  _optional_str(task_cfg, "data_dir")
  if name == STDLIB_TASK:
    num_classes = len(_stdlib_settings(task_cfg)["packages"])
    return TaskSpec(name, num_classes, text_fields=("text",),
                    metrics=("accuracy", "matthews_corrcoef"), eval_split="validation",
                    is_bytes=True)
  _glue_download(task_cfg)
  config = name.removeprefix("glue/")
  text_fields, num_classes = _GLUE[config]
  mnli = config == "mnli"
  return TaskSpec(name, num_classes, text_fields,
                  metrics=_GLUE_METRICS.get(config, ("accuracy",)),
                  eval_split="validation_matched" if mnli else "validation", is_bytes=False,
                  splits=_MNLI_SPLITS if mnli else _SPLITS)


def _prepared_builder(task_cfg: ml_collections.ConfigDict,
                      spec: TaskSpec) -> tfds.core.DatasetBuilder:
  """The task's TFDS builder, its records prepared in data_dir."""
  common = dict(data_dir=task_cfg.get("data_dir"), file_format="array_record")
  if spec.is_bytes:
    builder = stdlib_packages.StdlibPackages(**_stdlib_settings(task_cfg), **common)
  else:
    builder = glue.Glue(config=spec.name.removeprefix("glue/"), **common)
    if not _glue_download(task_cfg) and not builder.is_prepared():
      raise FileNotFoundError(
          f"{spec.name}: no prepared records in {builder.data_dir!r} and task.download is "
          f"False. Prepare them once with network access (task.download=True, same "
          f"task.data_dir), or copy a prepared '{builder.name}/{builder.builder_config.name}'"
          f" directory into task.data_dir={task_cfg.get('data_dir')!r}.")
  # TFDS's prepared copies on GCS are TFRecord files, never array_record: don't look for them.
  builder.download_and_prepare(
      download_config=tfds.download.DownloadConfig(try_download_gcs=False))
  return builder


def _subset_indices(num_records: int, n_examples: int | None, seed: int,
                    split: str) -> np.ndarray:
  """All record indices in order, or `n_examples` of them drawn without replacement.

  The draw is a prefix of a seeded permutation, so a smaller subset with the same seed is a
  prefix of a larger one.
  """
  if n_examples is None:
    return np.arange(num_records)
  validation.require(
      isinstance(n_examples, int) and 0 < n_examples <= num_records, "n_examples",
      f"None or a positive integer at most the {num_records} examples of split {split!r}",
      n_examples)
  return np.random.default_rng(seed).permutation(num_records)[:n_examples]


def _as_str(text) -> str:
  """A GLUE text as str: prepared records hold UTF-8 bytes (TFDS mocks give str)."""
  return text.decode("utf-8") if isinstance(text, bytes) else str(text)


def load_task_split(task_cfg: ml_collections.ConfigDict, split: str, *,
                    n_examples: int | None = None, seed: int = 0) -> ClassificationSplit:
  """Prepares the task if needed and returns a split, or `n_examples` of it chosen by `seed`.

  The full split keeps the record order. GLUE test splits have labels -1 (see module doc).
  """
  spec = task_spec(task_cfg)
  validation.require_choice(split, "split", spec.splits)
  source = _prepared_builder(task_cfg, spec).as_data_source(split)
  indices = _subset_indices(len(source), n_examples, seed, split)
  records = [source[int(i)] for i in indices]
  if spec.is_bytes:
    texts = tuple([bytes(np.asarray(r[field])) for r in records] for field in spec.text_fields)
  else:
    texts = tuple([_as_str(r[field]) for r in records] for field in spec.text_fields)
  label_dtype = np.float32 if spec.num_classes == 1 else np.int32
  labels = np.array([r["label"] for r in records], dtype=label_dtype).reshape(len(records))
  return ClassificationSplit(texts, labels)
