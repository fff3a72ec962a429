"""GLUE evaluation metrics, and the per-task GLUE score.

The fine-tuning tasks (`sparse_jax.data.classification`) are scored with the metrics GLUE
(Wang et al., 2018) prescribes: accuracy, binary F1, Matthews correlation, and Pearson and
Spearman correlation for the STS-B regression task. The classification metrics are written
here in numpy, so the library does not depend on scikit-learn (the tests compare them with
it); the correlations are scipy's.

Conventions: `pred` and `label` are 1-D arrays of equal, non-zero length (class ids for the
classification metrics, floats for the correlations). Where a metric is undefined (a constant
input to a correlation, no positive example for F1), it is 0.0, as scikit-learn returns for
F1 and the Matthews correlation (scipy returns NaN for a constant correlation input; 0.0 keeps
logs and model selection finite).

`glue_score` is the single number per task that enters a GLUE average: accuracy for most
tasks, the Matthews correlation for CoLA, the mean of Pearson and Spearman for STS-B, and the
mean of accuracy and F1 for MRPC and QQP (the GLUE leaderboard's rule). `spartan_score` is the
SPARTAN paper's (App. C): accuracy alone for QQP, MNLI-m only (our MNLI is scored on the matched
validation set), and for MRPC one number the paper does not name (`mrpc`: accuracy by default,
which App. C lists for every pair task it names; or "f1", or "mean" of the two).
"""

from typing import Callable, Iterable

import numpy as np

from sparse_jax import validation


def _check_pair(pred: np.ndarray, label: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  pred, label = np.asarray(pred), np.asarray(label)
  if pred.ndim != 1 or pred.shape != label.shape or not pred.size:
    raise ValueError(f"metrics need two non-empty 1-D arrays of equal length; got shapes "
                     f"{pred.shape} and {label.shape}.")
  return pred, label


def accuracy(pred: np.ndarray, label: np.ndarray) -> float:
  """The fraction of predictions equal to their label."""
  pred, label = _check_pair(pred, label)
  return float(np.mean(pred == label))


def f1(pred: np.ndarray, label: np.ndarray) -> float:
  """Binary F1 of the positive class 1 (MRPC: equivalent; QQP: duplicate)."""
  pred, label = _check_pair(pred, label)
  true_pos = np.sum((pred == 1) & (label == 1))
  false_pos = np.sum((pred == 1) & (label != 1))
  false_neg = np.sum((pred != 1) & (label == 1))
  denominator = 2 * true_pos + false_pos + false_neg
  return float(2 * true_pos / denominator) if denominator else 0.0


def _confusion_matrix(pred: np.ndarray, label: np.ndarray) -> np.ndarray:
  """[num_classes, num_classes] counts, rows the labels, over the classes seen in either."""
  classes, ids = np.unique(np.concatenate([label, pred]), return_inverse=True)
  label_ids, pred_ids = ids[:len(label)], ids[len(label):]
  counts = np.zeros((len(classes), len(classes)), np.int64)
  np.add.at(counts, (label_ids, pred_ids), 1)
  return counts


def matthews_corrcoef(pred: np.ndarray, label: np.ndarray) -> float:
  """Matthews correlation (the multiclass R_K of Gorodkin, 2004); 0.0 when undefined."""
  pred, label = _check_pair(pred, label)
  counts = _confusion_matrix(pred, label).astype(np.float64)
  label_totals, pred_totals = counts.sum(axis=1), counts.sum(axis=0)
  n, correct = counts.sum(), np.trace(counts)
  cov_label_pred = correct * n - label_totals @ pred_totals
  cov_pred_pred = n * n - pred_totals @ pred_totals
  cov_label_label = n * n - label_totals @ label_totals
  if cov_pred_pred * cov_label_label == 0:
    return 0.0
  return float(cov_label_pred / np.sqrt(cov_pred_pred * cov_label_label))


def _correlation(name: str, x: np.ndarray, y: np.ndarray) -> float:
  """`scipy.stats.<name>(x, y).statistic` in float64; 0.0 when either input is constant (one
  value, or all equal), where scipy warns and returns NaN."""
  # Imported here: scipy.stats takes ~0.9 s to import and only STS-B needs it, while every
  # `train.py` start imports this module.
  import scipy.stats  # pylint: disable=import-outside-toplevel
  x, y = _check_pair(x, y)
  if np.all(x == x[0]) or np.all(y == y[0]):
    return 0.0
  statistic = getattr(scipy.stats, name)
  return float(statistic(x.astype(np.float64), y.astype(np.float64)).statistic)


def pearson(x: np.ndarray, y: np.ndarray) -> float:
  """Pearson correlation coefficient (`scipy.stats.pearsonr`); 0.0 when either input is
  constant."""
  return _correlation("pearsonr", x, y)


def spearman(x: np.ndarray, y: np.ndarray) -> float:
  """Spearman rank correlation (`scipy.stats.spearmanr`: Pearson of the ranks, ties sharing
  their mean rank); 0.0 when either input is constant."""
  return _correlation("spearmanr", x, y)


def pearson_spearman(x: np.ndarray, y: np.ndarray) -> float:
  """The mean of Pearson and Spearman correlations: STS-B's GLUE score."""
  return (pearson(x, y) + spearman(x, y)) / 2.0


METRICS: dict[str, Callable[[np.ndarray, np.ndarray], float]] = {
    "accuracy": accuracy,
    "f1": f1,
    "matthews_corrcoef": matthews_corrcoef,
    "pearson": pearson,
    "spearman": spearman,
    "pearson_spearman": pearson_spearman,
}

# The metrics whose mean is a task's GLUE score; tasks not named here use accuracy.
_SCORE_METRICS = {
    "cola": ("matthews_corrcoef",),
    "stsb": ("pearson", "spearman"),
    "mrpc": ("accuracy", "f1"),
    "qqp": ("accuracy", "f1"),
}


def compute(metric_names: Iterable[str], predictions: np.ndarray,
            labels: np.ndarray) -> dict[str, float]:
  """{name: value} of the named `METRICS` on predictions (class ids or scores) and labels."""
  results = {}
  for name in metric_names:
    validation.require_choice(name, "metrics", METRICS)
    results[name] = METRICS[name](predictions, labels)
  return results


MRPC_SCORES = {"accuracy": ("accuracy",), "f1": ("f1",), "mean": ("accuracy", "f1")}


def _mean_of(task_name: str, metrics: dict[str, float], needed: tuple[str, ...]) -> float:
  missing = [name for name in needed if name not in metrics]
  if missing:
    raise ValueError(f"the score of {task_name!r} needs metrics {list(needed)}; "
                     f"missing {missing} from {sorted(metrics)}.")
  return float(np.mean([metrics[name] for name in needed]))


def spartan_score(task_name: str, metrics: dict[str, float], mrpc: str = "accuracy") -> float:
  """The task's number in the SPARTAN paper's GLUE average (module docstring)."""
  validation.require_choice(mrpc, "mrpc", MRPC_SCORES)
  config = task_name.removeprefix("glue/")
  needed = {"qqp": ("accuracy",), "mrpc": MRPC_SCORES[mrpc]}.get(
      config, _SCORE_METRICS.get(config, ("accuracy",)))
  return _mean_of(task_name, metrics, needed)


def glue_score(task_name: str, metrics: dict[str, float]) -> float:
  """The task's number in a GLUE average, from `compute`'s results for that task.

  `task_name` is a task of `sparse_jax.data.classification` ("glue/cola", "stdlib_packages")
  or a bare GLUE config name ("cola"). For MNLI, pass the matched validation results.
  """
  config = task_name.removeprefix("glue/")
  return _mean_of(task_name, metrics, _SCORE_METRICS.get(config, ("accuracy",)))
