"""GLUE tasks through `load_task_split`, offline.

Two routes: TFDS's real `glue.Glue` builder prepared from small TSV files in GLUE's own
archive layout (only the download manager is patched, to hand back the local folder for the
real GLUE URL), which checks exact texts and labels; and `tfds.testing.mock_data`, whose
random records check the fields and label types without preparing anything.
"""

import os

import ml_collections
import numpy as np
import pytest
import tensorflow_datasets as tfds
from tensorflow_datasets.text import glue

from glue_testing import GLUE_ARCHIVES

from sparse_jax.data import classification
from sparse_jax.tasks import classification_metrics

@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
  return str(tmp_path_factory.mktemp("glue_tfds"))


def task(name, data_dir, **fields):
  return ml_collections.ConfigDict(dict(name=name, data_dir=data_dir, max_len=32, **fields))


def test_real_builder_urls_are_the_served_ones():
  """The fake archives stand in for exactly the URLs the real builder downloads."""
  for config in ("cola", "rte", "mnli"):
    assert glue.Glue(config=config, data_dir="/nonexistent").builder_config.data_url in GLUE_ARCHIVES


def test_one_text_task_cola(offline_glue, data_dir):
  cfg = task("glue/cola", data_dir)
  spec = classification.task_spec(cfg)
  assert (spec.num_classes, spec.text_fields, spec.eval_split) == (2, ("sentence",), "validation")
  train = classification.load_task_split(cfg, "train")
  assert offline_glue[-1].endswith("CoLA.zip")
  by_text = dict(zip(train.texts[0], train.labels))
  assert by_text == {"Our friends won't buy this analysis.": 1, "They drank the pub.": 0,
                     'The café is "open".': 1}
  assert train.labels.dtype == np.int32
  dev = classification.load_task_split(cfg, "validation")
  assert sorted(zip(dev.texts[0], dev.labels.tolist())) == [("Him left.", 0), ("She left.", 1)]
  test = classification.load_task_split(cfg, "test")
  assert test.texts == (["What left?"],) and test.labels.tolist() == [-1]


def test_two_text_task_rte(offline_glue, data_dir):
  cfg = task("glue/rte", data_dir)
  spec = classification.task_spec(cfg)
  assert spec.text_fields == ("sentence1", "sentence2") and spec.metrics == ("accuracy",)
  dev = classification.load_task_split(cfg, "validation")
  # ClassLabel names: entailment = 0, not_entailment = 1.
  assert sorted(zip(*dev.texts, dev.labels.tolist())) == [
      ("Sam ate lunch.", "Sam was hungry.", 1), ("Two cats sleep.", "Cats sleep.", 0)]
  # Prepared records are found again without downloading.
  asked = len(offline_glue)
  again = classification.load_task_split(task("glue/rte", data_dir, download=False),
                                         "validation")
  assert again.texts == dev.texts and len(offline_glue) == asked
  np.testing.assert_array_equal(again.labels, dev.labels)
  few = classification.load_task_split(cfg, "train", n_examples=2, seed=3)
  assert len(few) == 2 and all(isinstance(t, str) for t in few.texts[1])
  with pytest.raises(ValueError, match="n_examples"):
    classification.load_task_split(cfg, "train", n_examples=4)


def test_mnli_evaluates_on_validation_matched(offline_glue, data_dir):
  cfg = task("glue/mnli", data_dir)
  spec = classification.task_spec(cfg)
  assert spec.eval_split == "validation_matched" and spec.num_classes == 3
  assert spec.text_fields == ("premise", "hypothesis")
  matched = classification.load_task_split(cfg, spec.eval_split)
  assert sorted(matched.texts[0]) == ["dev_matched premise one.", "dev_matched premise two."]
  assert sorted(matched.labels.tolist()) == [1, 2]  # neutral, contradiction.
  with pytest.raises(ValueError, match="split"):
    classification.load_task_split(cfg, "validation")


def test_download_false_without_records_names_the_directory(tmp_path):
  cfg = task("glue/rte", str(tmp_path / "empty"), download=False)
  expected_dir = os.path.join(str(tmp_path / "empty"), "glue", "rte")
  with pytest.raises(FileNotFoundError, match="task.download") as error:
    classification.load_task_split(cfg, "train")
  assert expected_dir in str(error.value)


def test_mock_data_serves_fields_and_label_types(tmp_path):
  """`mock_data` (AUTO policy: no metadata, so USE_CODE) serves `as_data_source` without TF."""
  with tfds.testing.mock_data(num_examples=7):
    sst2 = classification.load_task_split(task("glue/sst2", str(tmp_path)), "validation")
    stsb = classification.load_task_split(task("glue/stsb", str(tmp_path)), "train",
                                          n_examples=5)
  assert len(sst2.texts) == 1 and len(sst2) == 7
  assert all(isinstance(t, str) for t in sst2.texts[0])
  assert sst2.labels.dtype == np.int32 and set(sst2.labels.tolist()) <= {0, 1}
  assert len(stsb.texts) == 2 and len(stsb) == 5 and stsb.labels.dtype == np.float32


def test_task_config_errors_name_the_field():
  with pytest.raises(ValueError, match="task.name"):
    classification.task_spec(task("glue/ax", None))
  with pytest.raises(ValueError, match="task.download"):
    classification.task_spec(task("glue/rte", None, download="no"))
  specs = {name: classification.task_spec(task(name, None)) for name in classification.TASKS}
  assert specs["glue/stsb"].num_classes == 1
  assert specs["glue/qqp"].text_fields == ("question1", "question2")
  assert specs["glue/qnli"].text_fields == ("question", "sentence")
  assert specs["glue/mrpc"].metrics == ("accuracy", "f1")


def test_every_task_can_be_scored():
  """Each task's metrics exist, and they are what its GLUE score needs."""
  labels = np.array([0, 1, 1, 0, 1, 0])
  for name in classification.TASKS:
    spec = classification.task_spec(task(name, None))
    results = classification_metrics.compute(spec.metrics, labels, labels)
    assert classification_metrics.glue_score(name, results) == pytest.approx(1.0)
