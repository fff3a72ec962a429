"""Classification tasks by name: GLUE and the offline `stdlib_packages`, as in-memory splits.

SPARTAN is fine-tuned and evaluated on the nine GLUE tasks (the paper's App. C names the
metrics); `stdlib_packages` is an offline stand-in that needs no download (see
`sparse_jax.data.stdlib_packages`). `task_spec` describes a task and validates the `task`
config section without touching files; `load_task_split` prepares the task's TFDS records
(once: later calls find them in `data_dir`) and returns one split's texts and labels, or a
deterministic random subset of it (the paper's few-shot setting fine-tunes on 200 examples).

The `task` section is a tagged schema (`sparse_jax.schema`): `task.name` (one of `TASKS`)
picks `StdlibTaskConfig` or `GlueTaskConfig` below, which hold each task's fields and
defaults; `TaskConfig` holds those every task has, including `max_len` and `n_train`, which
fine-tuning reads.

GLUE is read with TFDS's own `glue.Glue` builder (its real download code; the TFDS name
lookup `tfds.builder("glue/rte")` needs TensorFlow, the class does not), through
`glue_builder.Glue`, which refuses rows TFDS would drop. GLUE's test splits
are unlabelled: their labels are -1 (classification) or -1.0 (STS-B), so they can be predicted
but not scored here.
"""

import dataclasses
from typing import Literal

import ml_collections
import numpy as np
import tensorflow_datasets as tfds

from sparse_jax import schema, validation
from sparse_jax.data import glue_builder, stdlib_packages

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
# Metrics logged per GLUE config (names of `tasks.classification_metrics.METRICS`).
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


class TaskConfig(schema.Schema, tag="name"):
  """The `task` section: `name` picks the task's schema; the fields every task has."""

  name: str  # The task: a GLUE task, or the offline standard-library one.
  max_len: schema.PositiveInt  # Tokens per example fed to the model (longer ones are cut).
  n_train: schema.PositiveInt | None = None  # Training examples drawn; None: the whole split.
  # How the `n_train` are drawn: a seeded random subset, or the split's first records (the
  # SPARTAN reference's few-shot script).
  n_train_from: Literal["random", "first"] = "random"
  data_dir: str | None = None  # None: ~/tensorflow_datasets.

  def spec(self) -> TaskSpec:
    raise NotImplementedError(f"{type(self).__name__} must define spec().")

  def builder(self) -> tfds.core.DatasetBuilder:
    """The task's TFDS builder (not prepared)."""
    raise NotImplementedError(f"{type(self).__name__} must define builder().")


@TaskConfig.variant(STDLIB_TASK)
class StdlibTaskConfig(TaskConfig):
  """Which stdlib package a snippet comes from (`sparse_jax.data.stdlib_packages`)."""

  source_root: str | None = None  # None: this Python's standard library.
  snippet_bytes: schema.PositiveInt = stdlib_packages.DEFAULT_SNIPPET_BYTES  # Per example.
  # Snippets taken from one source file at most.
  max_snippets_per_file: schema.PositiveInt = stdlib_packages.DEFAULT_MAX_SNIPPETS_PER_FILE
  packages: tuple[str, ...] = stdlib_packages.DEFAULT_PACKAGES  # The classes.

  def check(self, path: str) -> None:
    packages = self.packages
    validation.require(len(packages) >= 2 and len(set(packages)) == len(packages)
                       and all(p.isidentifier() for p in packages), f"{path}.packages",
                       "at least two distinct package names", packages)

  def spec(self) -> TaskSpec:
    return TaskSpec(self.name, len(self.packages), text_fields=("text",),
                    metrics=("accuracy", "matthews_corrcoef"), eval_split="validation",
                    is_bytes=True)

  def builder(self) -> tfds.core.DatasetBuilder:
    return stdlib_packages.StdlibPackages(
        source_root=self.source_root, packages=self.packages, snippet_bytes=self.snippet_bytes,
        max_snippets_per_file=self.max_snippets_per_file, data_dir=self.data_dir,
        file_format="array_record")


@TaskConfig.variant(*(f"glue/{config}" for config in _GLUE))
class GlueTaskConfig(TaskConfig):
  """A GLUE task, read by TFDS's `glue.Glue` builder."""

  download: bool = True  # False: never download; the records must be prepared in data_dir.

  def spec(self) -> TaskSpec:
    config = self.name.removeprefix("glue/")
    text_fields, num_classes = _GLUE[config]
    mnli = config == "mnli"
    return TaskSpec(self.name, num_classes, text_fields,
                    metrics=_GLUE_METRICS.get(config, ("accuracy",)),
                    eval_split="validation_matched" if mnli else "validation",
                    is_bytes=False, splits=_MNLI_SPLITS if mnli else _SPLITS)

  def builder(self) -> tfds.core.DatasetBuilder:
    builder = glue_builder.Glue(config=self.name.removeprefix("glue/"),
                                data_dir=self.data_dir, file_format="array_record")
    if not self.download and not builder.is_prepared():
      raise FileNotFoundError(
          f"{self.name}: no prepared records in {builder.data_dir!r} and task.download is "
          f"False. Prepare them once with network access (task.download=True, same "
          f"task.data_dir), or copy a prepared '{builder.name}/{builder.builder_config.name}'"
          f" directory into task.data_dir={self.data_dir!r}.")
    return builder


def parse(task_cfg: ml_collections.ConfigDict | dict | TaskConfig) -> TaskConfig:
  """The typed `task` section, every field of its task checked (no file access)."""
  return TaskConfig.parse(task_cfg, "task")


def task_spec(task_cfg: ml_collections.ConfigDict | dict | TaskConfig) -> TaskSpec:
  """The spec of `task_cfg.name`, after checking the task's config fields (no file access)."""
  return parse(task_cfg).spec()


def _prepared_builder(task: TaskConfig) -> tfds.core.DatasetBuilder:
  """The task's TFDS builder, its records prepared in data_dir."""
  builder = task.builder()
  # TFDS's prepared copies on GCS are TFRecord files, never array_record: don't look for them.
  builder.download_and_prepare(
      download_config=tfds.download.DownloadConfig(try_download_gcs=False))
  return builder


def _subset_indices(num_records: int, n_examples: int | None, seed: int,
                    split: str, first: bool) -> np.ndarray:
  """All record indices in order, the first `n_examples` (`first`), or `n_examples` drawn
  without replacement.

  The draw is a prefix of a seeded permutation, so a smaller subset with the same seed is a
  prefix of a larger one.
  """
  if n_examples is None:
    return np.arange(num_records)
  validation.require(
      isinstance(n_examples, int) and 0 < n_examples <= num_records, "n_examples",
      f"None or a positive integer at most the {num_records} examples of split {split!r}",
      n_examples)
  if first:
    return np.arange(n_examples)
  return np.random.default_rng(seed).permutation(num_records)[:n_examples]


def _as_str(text) -> str:
  """A GLUE text as str: prepared records hold UTF-8 bytes (TFDS mocks give str)."""
  return text.decode("utf-8") if isinstance(text, bytes) else str(text)


def load_task_split(task_cfg: ml_collections.ConfigDict, split: str, *,
                    n_examples: int | None = None, seed: int = 0,
                    first: bool = False) -> ClassificationSplit:
  """Prepares the task if needed and returns a split, or `n_examples` of it: chosen by
  `seed`, or its first records with `first`.

  The full split keeps the record order. GLUE test splits have labels -1 (see module doc).
  """
  task = parse(task_cfg)
  spec = task.spec()
  validation.require_choice(split, "split", spec.splits)
  source = _prepared_builder(task).as_data_source(split)
  indices = _subset_indices(len(source), n_examples, seed, split, first)
  records = [source[int(i)] for i in indices]
  if spec.is_bytes:
    texts = tuple([bytes(np.asarray(r[field])) for r in records] for field in spec.text_fields)
  else:
    texts = tuple([_as_str(r[field]) for r in records] for field in spec.text_fields)
  label_dtype = np.float32 if spec.num_classes == 1 else np.int32
  labels = np.array([r["label"] for r in records], dtype=label_dtype).reshape(len(records))
  return ClassificationSplit(texts, labels)
