"""Sequence-to-sequence datasets by name: what the seq2seq task (Terraformer) reads.

The `data` section is a tagged schema: `data.name` picks the dataset ("arithmetic": the copy
and add tasks of `sparse_jax.data.arithmetic`; "arxiv": summarisation,
`sparse_jax.data.arxiv`). Each gives the task one `Seq2SeqData`: token ids with PAD 0 and
EOS 1, padded batches `{"inputs": int32 [B, S], "targets": int32 [B, T]}`, and how its
answers are scored.
"""

import abc

import grain
import numpy as np

from sparse_jax import schema
from sparse_jax.data import arithmetic, arxiv, padded_batches, rouge_metrics


class Seq2SeqData(abc.ABC):
  """A dataset as the seq2seq task reads it."""

  vocab_size: int

  @abc.abstractmethod
  def max_lengths(self, split: str) -> tuple[int, int]:
    """`(S, T)`: the padded input and target lengths of `split`'s batches."""

  @abc.abstractmethod
  def train_iterator(self, batch_size: int, rows: slice) -> grain.DatasetIterator:
    """Endless, checkpointable padded training batches (`rows` of each global batch)."""

  @abc.abstractmethod
  def eval_arrays(self, split: str, max_examples: int | None) -> dict[str, np.ndarray]:
    """The first `max_examples` (None: all) of `split`, padded: `inputs [N, S]`,
    `targets [N, T]`."""

  @abc.abstractmethod
  def score(self, answers_nt: np.ndarray, split: str, n: int) -> dict[str, float]:
    """Metrics of greedy answers `[n, T']` (token ids, cut at EOS) for `split`'s first `n`
    examples."""


class Seq2SeqDataConfig(schema.Schema, tag="name"):
  """The `data` section: `name` picks the dataset's schema; `batch_size` is the training
  batch."""

  name: str  # The dataset: "arithmetic" (copy/add) or "arxiv".
  batch_size: schema.PositiveInt  # Training examples per step.

  def load(self) -> Seq2SeqData:
    raise NotImplementedError(f"{type(self).__name__} must define load().")


@Seq2SeqDataConfig.variant("arithmetic")
class ArithmeticData(Seq2SeqDataConfig, arithmetic.ArithmeticConfig):
  """Copy or add (`data.task`), offline (Table 4)."""

  def load(self) -> Seq2SeqData:
    return _Arithmetic(self)


class _Arithmetic(Seq2SeqData):
  """Scored per digit and per sequence (`arithmetic.per_digit_accuracy`, Table 4)."""

  vocab_size = arithmetic.VOCAB_SIZE

  def __init__(self, cfg: ArithmeticData):
    self.cfg = cfg

  def max_lengths(self, split: str) -> tuple[int, int]:
    return arithmetic.max_lengths(self.cfg, split)

  def train_iterator(self, batch_size: int, rows: slice) -> grain.DatasetIterator:
    return arithmetic.train_iterator(self.cfg, batch_size, rows)

  def eval_arrays(self, split: str, max_examples: int | None) -> dict[str, np.ndarray]:
    return padded_batches.stacked(arithmetic.padded_dataset(self.cfg, split), max_examples)

  def score(self, answers_nt: np.ndarray, split: str, n: int) -> dict[str, float]:
    targets = self.eval_arrays(split, n)["targets"]
    return {"per_digit_accuracy": arithmetic.per_digit_accuracy(answers_nt, targets),
            "sequence_accuracy": arithmetic.sequence_accuracy(answers_nt, targets)}


@Seq2SeqDataConfig.variant("arxiv")
class ArxivData(Seq2SeqDataConfig, arxiv.ArxivConfig):
  """arXiv summarisation (Table 5): TFDS `scientific_papers/arxiv`, SentencePiece ids."""

  seed: schema.NonNegativeInt = 0  # Shuffles the training examples.

  def load(self) -> Seq2SeqData:
    return _Arxiv(self)


class _Arxiv(Seq2SeqData):
  """Scored by ROUGE F1 x 100 of the decoded answers against the abstracts
  (`rouge_metrics.rouge_scores`). Splits are prepared (and the tokenizer trained) on first
  use."""

  def __init__(self, cfg: ArxivData):
    self.cfg = cfg
    self.vocab_size = cfg.vocab_size
    self._splits: dict[str, arxiv.ArxivSplit] = {}

  def _split(self, split: str) -> arxiv.ArxivSplit:
    if split not in self._splits:
      self._splits[split] = arxiv.load_split(self.cfg, split)
    return self._splits[split]

  def _padded(self, split: str) -> grain.MapDataset:
    return padded_batches.padded(self._split(split).examples, *self.max_lengths(split))

  def max_lengths(self, split: str) -> tuple[int, int]:
    return arxiv.max_lengths(self.cfg)

  def train_iterator(self, batch_size: int, rows: slice) -> grain.DatasetIterator:
    return padded_batches.train_iterator(self._padded("train"), seed=self.cfg.seed,
                                         batch_size=batch_size, rows=rows)

  def eval_arrays(self, split: str, max_examples: int | None) -> dict[str, np.ndarray]:
    return padded_batches.stacked(self._padded(split), max_examples)

  def score(self, answers_nt: np.ndarray, split: str, n: int) -> dict[str, float]:
    data = self._split(split)
    answers = [arxiv.decode_answer(data.tokenizer, ids) for ids in answers_nt[:n]]
    return rouge_metrics.rouge_scores(answers, [data.references[i] for i in range(n)])
