"""ROUGE F1 of generated summaries, as Scaling Transformers reports arXiv summarisation
(Sec. 4.4, Table 5: R-1, R-2, R-LSum and R-LSent).

The paper scores with Google's open-source scorer, the `rouge-score` package, and reports F1
only. `rouge_scores` returns, for each of its four ROUGE types, the mean over examples of the
per-example F1, times 100 (the papers' scale). T5 reports the median of bootstrap resamples of
that mean (`scoring.BootstrapAggregator`), which is the mean up to resampling noise; the plain
mean is exact and reproducible.

Choices, as T5 and the scorer's documentation make them:
  - Tokenisation is the scorer's default: lowercase, every run of characters other than ASCII
    letters and digits is a separator (so non-ASCII letters split words and count for
    nothing), and the Porter stemmer is applied to tokens longer than 3 characters
    (`use_stemmer=True`, as in T5's and Trax's evaluation).
  - "rougeL" is sentence-level ROUGE-L (the paper's R-LSent): the longest common subsequence
    of the two whole token sequences, newlines ignored.
  - "rougeLsum" is summary-level ROUGE-L (R-LSum): texts are split into sentences at newlines
    (`split_summaries=False`; blank lines dropped) and each reference sentence is matched
    against all predicted sentences (the union of their LCSs). Both texts must therefore hold
    one sentence per line: the arXiv references do (`sparse_jax.data.arxiv.reference_text`),
    and a model trained on them writes newlines between sentences; a text without newlines is
    one sentence, and ROUGE-Lsum then equals ROUGE-L.
  - An empty prediction or reference scores 0 on every type.
"""

from typing import Sequence

ROUGE_TYPES = ("rouge1", "rouge2", "rougeL", "rougeLsum")


def rouge_scores(predictions: Sequence[str], references: Sequence[str]) -> dict[str, float]:
  """Mean F1 x 100 of each ROUGE type in `ROUGE_TYPES` over paired texts (module docstring).

  Raises `ValueError` when the two lists differ in length or are empty (no mean exists).
  """
  if len(predictions) != len(references):
    raise ValueError(f"rouge_scores needs one reference per prediction; got "
                     f"{len(predictions)} predictions and {len(references)} references.")
  if not predictions:
    raise ValueError("rouge_scores needs at least one prediction and reference.")
  # Imported here: rouge_score imports nltk (about 2 s), which every train.py start would pay.
  from rouge_score import rouge_scorer  # pylint: disable=import-outside-toplevel
  scorer = rouge_scorer.RougeScorer(list(ROUGE_TYPES), use_stemmer=True, split_summaries=False)
  totals = dict.fromkeys(ROUGE_TYPES, 0.0)
  for prediction, reference in zip(predictions, references):
    scores = scorer.score(target=reference, prediction=prediction)
    for rouge_type in ROUGE_TYPES:
      totals[rouge_type] += scores[rouge_type].fmeasure
  return {rouge_type: 100.0 * total / len(predictions) for rouge_type, total in totals.items()}
