"""The numpy GLUE metrics against scikit-learn and scipy, and the per-task GLUE score."""

import numpy as np
import pytest
import scipy.stats
import sklearn.metrics

from sparse_jax.tasks import classification_metrics as cm
from sparse_jax.validation import ConfigError


def random_labels(seed: int, n: int, num_classes: int) -> tuple[np.ndarray, np.ndarray]:
  rng = np.random.default_rng(seed)
  label = rng.integers(0, num_classes, size=n)
  # Predictions agree with the label more often than chance, so values are not all near 0.
  pred = np.where(rng.random(n) < 0.6, label, rng.integers(0, num_classes, size=n))
  return pred, label


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("num_classes", [2, 3, 5])
def test_classification_metrics_match_sklearn(seed, num_classes):
  pred, label = random_labels(seed, n=37 + seed * 11, num_classes=num_classes)
  assert cm.accuracy(pred, label) == pytest.approx(sklearn.metrics.accuracy_score(label, pred))
  assert cm.matthews_corrcoef(pred, label) == pytest.approx(
      sklearn.metrics.matthews_corrcoef(label, pred))
  if num_classes == 2:
    assert cm.f1(pred, label) == pytest.approx(sklearn.metrics.f1_score(label, pred))


def test_undefined_mcc_and_f1_are_zero_like_sklearn():
  label = np.array([0, 1, 1, 0, 1])
  constant = np.ones_like(label)
  assert cm.matthews_corrcoef(constant, label) == 0.0
  assert sklearn.metrics.matthews_corrcoef(label, constant) == 0.0
  assert cm.matthews_corrcoef(label, constant) == 0.0  # Constant labels.
  zeros = np.zeros_like(label)
  assert cm.f1(zeros, zeros) == 0.0  # No positives anywhere.
  assert cm.f1(constant, label) == pytest.approx(sklearn.metrics.f1_score(label, constant))


def test_mcc_of_labels_not_numbered_from_zero():
  pred, label = random_labels(7, n=50, num_classes=3)
  assert cm.matthews_corrcoef(pred + 5, label + 5) == pytest.approx(
      sklearn.metrics.matthews_corrcoef(label, pred))
  # A class only predicted, never a label.
  pred[:3] = 9
  assert cm.matthews_corrcoef(pred, label) == pytest.approx(
      sklearn.metrics.matthews_corrcoef(label, pred))


@pytest.mark.parametrize("seed", range(5))
def test_correlations_match_scipy(seed):
  rng = np.random.default_rng(100 + seed)
  n = 40 + 7 * seed
  y = rng.uniform(0, 5, size=n)
  x = y + rng.normal(0, 1.5, size=n)
  assert cm.pearson(x, y) == pytest.approx(scipy.stats.pearsonr(x, y)[0])
  assert cm.spearman(x, y) == pytest.approx(scipy.stats.spearmanr(x, y)[0])
  # Heavy ties, as in STS-B's 0.2-step gold scores and rounded predictions.
  x_tied, y_tied = np.round(x), np.round(y * 5) / 5
  assert cm.spearman(x_tied, y_tied) == pytest.approx(
      scipy.stats.spearmanr(x_tied, y_tied)[0])
  assert cm.pearson_spearman(x_tied, y_tied) == pytest.approx(
      (scipy.stats.pearsonr(x_tied, y_tied)[0] + scipy.stats.spearmanr(x_tied, y_tied)[0]) / 2)


@pytest.mark.filterwarnings("error")  # scipy's ConstantInputWarning: not reached.
def test_constant_correlation_input_is_zero():
  assert cm.pearson(np.ones(5), np.arange(5.0)) == 0.0
  assert cm.spearman(np.arange(5.0), np.full(5, 2.0)) == 0.0
  assert cm.pearson_spearman(np.ones(1), np.zeros(1)) == 0.0


def test_bad_shapes_are_refused():
  with pytest.raises(ValueError, match="equal length"):
    cm.accuracy(np.zeros(3), np.zeros(4))
  with pytest.raises(ValueError, match="non-empty"):
    cm.pearson(np.zeros(0), np.zeros(0))


def test_compute_and_glue_score():
  pred, label = random_labels(3, n=60, num_classes=2)
  results = cm.compute(("accuracy", "f1"), pred, label)
  assert results == {"accuracy": cm.accuracy(pred, label), "f1": cm.f1(pred, label)}
  assert cm.glue_score("glue/mrpc", results) == pytest.approx(
      (results["accuracy"] + results["f1"]) / 2)
  assert cm.glue_score("glue/rte", results) == results["accuracy"]
  assert cm.glue_score("stdlib_packages", results) == results["accuracy"]
  assert cm.glue_score("cola", {"matthews_corrcoef": 0.25}) == 0.25
  assert cm.glue_score("glue/stsb", {"pearson": 0.8, "spearman": 0.6}) == pytest.approx(0.7)
  with pytest.raises(ValueError, match="matthews_corrcoef"):
    cm.glue_score("glue/cola", results)
  with pytest.raises(ConfigError, match="metrics"):
    cm.compute(("auc",), pred, label)


def test_spartan_score_follows_the_papers_appendix_c():
  results = {"accuracy": 0.8, "f1": 0.9}
  assert cm.spartan_score("glue/qqp", results) == 0.8  # accuracy alone, unlike GLUE's rule
  assert cm.spartan_score("glue/mrpc", results) == 0.8
  assert cm.spartan_score("glue/mrpc", results, mrpc="f1") == 0.9
  assert cm.spartan_score("glue/mrpc", results, mrpc="mean") == pytest.approx(0.85)
  assert cm.spartan_score("glue/cola", {"matthews_corrcoef": 0.3}) == 0.3
  assert cm.spartan_score("glue/stsb", {"pearson": 0.8, "spearman": 0.6}) == pytest.approx(0.7)
  assert cm.spartan_score("glue/mnli", results) == 0.8
  with pytest.raises(ConfigError, match="mrpc"):
    cm.spartan_score("glue/mrpc", results, mrpc="auc")
