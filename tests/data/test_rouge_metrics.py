"""ROUGE F1 against a brute-force reference written from the definitions (Lin, 2004).

Words of at most 3 letters are never stemmed by the scorer's Porter stemmer, so texts made of
them let the reference tokenise by lowercasing and splitting on non-alphanumerics alone.
"""

import collections
import re

import numpy as np
import pytest

from sparse_jax.data import rouge_metrics

WORDS = ["the", "cat", "sat", "on", "a", "mat", "dog", "ran", "far", "and", "It", "Sun"]


def tokens(text: str) -> list[str]:
  return [t for t in re.split(r"[^a-z0-9]+", text.lower()) if t]


def f1(overlap: float, n_prediction: int, n_reference: int) -> float:
  if overlap == 0:
    return 0.0
  precision, recall = overlap / n_prediction, overlap / n_reference
  return 2 * precision * recall / (precision + recall)


def ngram_f1(prediction: list[str], reference: list[str], n: int) -> float:
  grams = lambda ts: collections.Counter(tuple(ts[i:i + n]) for i in range(len(ts) - n + 1))
  p, r = grams(prediction), grams(reference)
  return f1(sum((p & r).values()), sum(p.values()), sum(r.values()))


def lcs_table(a: list[str], b: list[str]) -> np.ndarray:
  table = np.zeros((len(a) + 1, len(b) + 1), int)
  for i, x in enumerate(a):
    for j, y in enumerate(b):
      table[i + 1, j + 1] = table[i, j] + 1 if x == y else max(table[i, j + 1], table[i + 1, j])
  return table


def lcs_positions(a: list[str], b: list[str]) -> set[int]:
  """Indices into `a` of one longest common subsequence of `a` and `b` (backtracked)."""
  table, i, j, kept = lcs_table(a, b), len(a), len(b), set()
  while i and j:
    if a[i - 1] == b[j - 1]:
      kept.add(i - 1)
      i, j = i - 1, j - 1
    elif table[i - 1, j] >= table[i, j - 1]:
      i -= 1
    else:
      j -= 1
  return kept


def lsum_f1(prediction: str, reference: str) -> float:
  """Summary-level LCS: each reference sentence's union LCS with all predicted sentences,
  hits clipped by the counts of each word on both sides (as the scorer does)."""
  p_sents = [tokens(s) for s in prediction.split("\n") if tokens(s)]
  r_sents = [tokens(s) for s in reference.split("\n") if tokens(s)]
  p_left = collections.Counter(t for s in p_sents for t in s)
  r_left = collections.Counter(t for s in r_sents for t in s)
  hits = 0
  for r in r_sents:
    union = set().union(*(lcs_positions(r, p) for p in p_sents))
    for t in (r[i] for i in sorted(union)):
      if p_left[t] > 0 and r_left[t] > 0:
        hits, p_left[t], r_left[t] = hits + 1, p_left[t] - 1, r_left[t] - 1
  return f1(hits, sum(len(s) for s in p_sents), sum(len(s) for s in r_sents))


def text(rng: np.random.Generator) -> str:
  return "\n".join(" ".join(rng.choice(WORDS, size=int(rng.integers(2, 8))))
                   for _ in range(int(rng.integers(1, 4))))


def test_scores_match_the_definitions_on_random_texts():
  rng = np.random.default_rng(0)
  predictions, references = [text(rng) for _ in range(30)], [text(rng) for _ in range(30)]
  expected = {"rouge1": [], "rouge2": [], "rougeL": [], "rougeLsum": []}
  for p, r in zip(predictions, references):
    expected["rouge1"].append(ngram_f1(tokens(p), tokens(r), 1))
    expected["rouge2"].append(ngram_f1(tokens(p), tokens(r), 2))
    expected["rougeL"].append(f1(lcs_table(tokens(p), tokens(r))[-1, -1], len(tokens(p)),
                                 len(tokens(r))))
    expected["rougeLsum"].append(lsum_f1(p, r))
  scores = rouge_metrics.rouge_scores(predictions, references)
  assert scores == pytest.approx({k: 100 * np.mean(v) for k, v in expected.items()}, abs=1e-9)


def test_identical_texts_score_100_and_disjoint_ones_0():
  assert rouge_metrics.rouge_scores(["the cat\nsat on"], ["The cat\nsat on"]) == pytest.approx(
      dict.fromkeys(rouge_metrics.ROUGE_TYPES, 100.0))
  assert rouge_metrics.rouge_scores(["dog ran", ""], ["the cat", "the cat"]) == dict.fromkeys(
      rouge_metrics.ROUGE_TYPES, 0.0)


def test_lsum_reads_sentences_where_l_does_not():
  """Sentences in the other order: ROUGE-L finds one of them, ROUGE-Lsum both."""
  scores = rouge_metrics.rouge_scores(["dog ran far\nthe cat sat"], ["the cat sat\ndog ran far"])
  assert scores["rougeLsum"] == pytest.approx(100.0)
  assert scores["rougeL"] == pytest.approx(100 * 3 / 6)


@pytest.mark.parametrize("predictions,references", [(["a"], []), ([], [])])
def test_mismatched_or_empty_lists_are_refused(predictions, references):
  with pytest.raises(ValueError, match="rouge_scores needs"):
    rouge_metrics.rouge_scores(predictions, references)
