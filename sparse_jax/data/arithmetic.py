"""Length-generalisation tasks of Scaling Transformers (Sec. 4.3, Table 4): copy and add.

Terraformer's recurrence (`sparse_jax.layers.sru`) is motivated by out-of-distribution
length generalisation: models train on inputs of at most 128 digits and are tested on 256 to
300 digits. Both tasks are offline synthetic sequence-to-sequence data; example `i` of split
`s` is a pure function of `(seed, s, i)` (its own numpy generator), so a grain pipeline can
read any example at any time and a resumed run sees the same data.

Tasks (Trax 1.4 `trax/data/inputs.py`, `simple_sequence_copy_inputs` and
`addition_input_stream`), with `n` drawn uniformly in the split's `[min_len, max_len]`:

- copy: inputs are `n` uniform random decimal digits, the target is the same digits.
- add: `n` is the total number of digits of the two operands (the separator not counted, as
  Trax counts the whole input): the first has `n_a` ~ U[1, n - 1] digits, the second
  `n - n_a`. Inputs are `a SEP b`, the target `a + b`. As in Trax, every number is written
  lower-endian (least significant digit first: `random_number_lower_endian`,
  `number_to_lower_endian`), so the model emits the sum in the order the carries flow; an
  operand's most significant (last) digit is non-zero unless it has a single digit, and the
  sum has no leading zeros. Trax draws the first operand's length differently (at most about
  half the length); here the split point is uniform. With `n` >= 2 the sum has at most `n`
  digits.

Tokens (`VOCAB_SIZE` = 13): PAD 0, EOS 1, digit d -> `FIRST_DIGIT + d` (2..11), SEPARATOR 12.
An example is `{"inputs": int32[n_in + 1], "targets": int32[n_out + 1]}`, each ending with
EOS. `padded_dataset` pads both to the split's longest (`max_lengths`) with PAD for batching.

Scoring (Table 4): `per_digit_accuracy` and `sequence_accuracy` compare a model's answers
with the targets; their docstrings define how length mismatches count.

The `ArithmeticConfig` schema holds the task, the length range and size of each split, and
the seed.
"""

from typing import Literal, Sequence

import grain
import numpy as np

from sparse_jax import schema, validation
from sparse_jax.data import padded_batches

PAD, EOS = padded_batches.PAD, 1
FIRST_DIGIT = 2  # Digit d is token FIRST_DIGIT + d.
SEPARATOR = FIRST_DIGIT + 10
VOCAB_SIZE = SEPARATOR + 1
TASKS = ("copy", "add")
# Train and validation (a held-out stream) have the train lengths; test the longer ones
# (Table 4).
SPLITS = ("train", "validation", "test")
_SPLIT_STREAMS = {"train": 0, "test": 1, "validation": 2}


class ArithmeticConfig(schema.Schema):
  """The copy/add task (module docstring): digit-count ranges per split, sizes and seed.

  Defaults are the paper's setting (Sec. 4.3): train on at most 128 digits, test on 256 to
  300. The minimum of 2 lets one default serve both tasks (add needs a digit per operand).
  """

  task: Literal[TASKS]  # Copy the digits, or add two numbers.
  train_min_len: schema.PositiveInt = 2  # Digits of the train split's examples, at least.
  train_max_len: schema.PositiveInt = 128  # At most.
  test_min_len: schema.PositiveInt = 256  # Digits of the test split's examples, at least.
  test_max_len: schema.PositiveInt = 300  # At most.
  n_train: schema.PositiveInt = 1_000_000  # Examples in the train split (then epochs repeat).
  n_eval: schema.PositiveInt = 1_000  # Examples in the validation and test splits.
  seed: schema.NonNegativeInt = 0  # Of the examples' draw.

  def check(self, path: str) -> None:
    shortest = 2 if self.task == "add" else 1
    for split in ("train", "test"):  # Validation has the train lengths.
      min_len, max_len = self.lengths(split)
      validation.require(min_len >= shortest, schema.join(path, f"{split}_min_len"),
                         f"at least {shortest} for task={self.task!r}", min_len)
      validation.require(max_len >= min_len, schema.join(path, f"{split}_max_len"),
                         f"at least {split}_min_len={min_len}", max_len)

  def lengths(self, split: str) -> tuple[int, int]:
    """The split's `(min_len, max_len)` digit counts, both included."""
    validation.require_choice(split, "split", SPLITS)
    if split == "test":
      return self.test_min_len, self.test_max_len
    return self.train_min_len, self.train_max_len

  def size(self, split: str) -> int:
    """Number of examples in the split."""
    validation.require_choice(split, "split", SPLITS)
    return self.n_train if split == "train" else self.n_eval


def digit_tokens(digits: Sequence[int]) -> np.ndarray:
  """Token ids `int32 [len(digits)]` of decimal digits."""
  return np.asarray(digits, np.int32) + FIRST_DIGIT


def lower_endian_digits(number: int) -> list[int]:
  """The decimal digits of `number >= 0`, least significant first, no leading zeros."""
  return [int(d) for d in reversed(str(number))]


def lower_endian_value(digits: Sequence[int]) -> int:
  """The number whose lower-endian decimal digits are `digits`."""
  return int("".join(str(int(d)) for d in reversed(digits)))


def random_operand(rng: np.random.Generator, n_digits: int) -> list[int]:
  """`n_digits` lower-endian digits of a random number: its most significant (last) digit is
  non-zero unless it is the only one (Trax `random_number_lower_endian`)."""
  if n_digits == 1:
    return [int(rng.integers(10))]
  return [int(d) for d in rng.integers(10, size=n_digits - 1)] + [int(rng.integers(1, 10))]


def copy_tokens(rng: np.random.Generator, n_digits: int) -> tuple[np.ndarray, np.ndarray]:
  """`(inputs, target)` tokens of a copy example, without EOS: `n_digits` digits, twice."""
  digits = digit_tokens(rng.integers(10, size=n_digits))
  return digits, digits


def add_tokens(rng: np.random.Generator, n_digits: int) -> tuple[np.ndarray, np.ndarray]:
  """`(inputs, target)` tokens of an add example, without EOS: `a SEPARATOR b` and `a + b`,
  lower-endian, the operands' digit counts summing to `n_digits >= 2`."""
  n_a = int(rng.integers(1, n_digits))
  a, b = random_operand(rng, n_a), random_operand(rng, n_digits - n_a)
  total = lower_endian_value(a) + lower_endian_value(b)
  inputs = np.concatenate([digit_tokens(a), [SEPARATOR], digit_tokens(b)])
  return inputs, digit_tokens(lower_endian_digits(total))


def _with_eos(tokens: np.ndarray) -> np.ndarray:
  """`int32 [len(tokens) + 1]`: `tokens`, then EOS."""
  return np.append(tokens, EOS).astype(np.int32)


def example(config: ArithmeticConfig, split: str, index: int) -> dict[str, np.ndarray]:
  """Example `index` of `split`: `{"inputs": int32[n_in + 1], "targets": int32[n_out + 1]}`,
  each ending with EOS; a pure function of `(config.seed, split, index)`."""
  if not 0 <= index < config.size(split):
    raise IndexError(f"example {index} of split {split!r}, which has {config.size(split)}.")
  rng = np.random.default_rng((config.seed, _SPLIT_STREAMS[split], int(index)))
  min_len, max_len = config.lengths(split)
  n_digits = int(rng.integers(min_len, max_len + 1))
  make = copy_tokens if config.task == "copy" else add_tokens
  inputs, targets = make(rng, n_digits)
  return {"inputs": _with_eos(inputs), "targets": _with_eos(targets)}


def max_lengths(config: ArithmeticConfig, split: str) -> tuple[int, int]:
  """The longest `(inputs, targets)` of the split in tokens, EOS included: the padded shape.

  add: `max_len` digits plus the separator in; the sum has at most `max_len` digits.
  """
  max_len = config.lengths(split)[1]
  separator = 1 if config.task == "add" else 0
  return max_len + separator + 1, max_len + 1


class ArithmeticSource:
  """A grain random-access source: element i is `example(config, split, i)` (unpadded)."""

  def __init__(self, config: ArithmeticConfig, split: str):
    validation.require_choice(split, "split", SPLITS)
    self._config, self._split = config, split

  def __len__(self) -> int:
    return self._config.size(self._split)

  def __getitem__(self, index: int) -> dict[str, np.ndarray]:
    return example(self._config, self._split, index)

  def __repr__(self) -> str:
    return f"ArithmeticSource(task={self._config.task!r}, split={self._split!r}, n={len(self)})"


def padded_dataset(config: ArithmeticConfig, split: str) -> grain.MapDataset:
  """The split's examples in index order, padded to `max_lengths(config, split)` so they
  batch (`.batch(batch_size)`)."""
  return padded_batches.padded(grain.MapDataset.source(ArithmeticSource(config, split)),
                               *max_lengths(config, split))


def train_iterator(config: ArithmeticConfig, batch_size: int,
                   rows: slice = slice(None)) -> grain.DatasetIterator:
  """Endless, resumable padded train batches (`padded_batches.train_iterator`)."""
  return padded_batches.train_iterator(padded_dataset(config, "train"), seed=config.seed,
                                       batch_size=batch_size, rows=rows)


def answer(tokens: np.ndarray) -> np.ndarray:
  """A sequence's answer: its tokens before the first EOS or PAD (all of them if neither)."""
  tokens = np.asarray(tokens)
  ends = np.flatnonzero((tokens == EOS) | (tokens == PAD))
  return tokens[:ends[0]] if len(ends) else tokens


def _answers(predicted, target) -> list[tuple[np.ndarray, np.ndarray]]:
  if len(predicted) != len(target):
    raise ValueError(f"predicted has {len(predicted)} sequences, target {len(target)}.")
  return [(answer(p), answer(t)) for p, t in zip(predicted, target)]


def per_digit_accuracy(predicted, target) -> float:
  """Fraction of digit positions right over a set of examples (Table 4, "copy", "add").

  `predicted` and `target` hold one token sequence per example (`[N, L]` arrays, or lists of
  1-D arrays of any lengths); each is cut to its `answer` (tokens before the first EOS or
  PAD). Position j of a prediction is right when it equals the target's position j (the same
  place value, both lower-endian). An example counts `max(len(p), len(t))` positions: target
  digits the prediction lacks and extra predicted tokens past the target's end are wrong.
  The accuracy is all right positions over all counted positions of the set (so longer
  examples weigh more); 0.0 when nothing is counted.
  """
  right = counted = 0
  for p, t in _answers(predicted, target):
    overlap = min(len(p), len(t))
    right += int(np.sum(p[:overlap] == t[:overlap]))
    counted += max(len(p), len(t))
  return right / counted if counted else 0.0


def sequence_accuracy(predicted, target) -> float:
  """Fraction of examples whose whole answer is right (Table 4, "(seq)"): the prediction's
  `answer` equals the target's, same length and every token. Inputs as `per_digit_accuracy`."""
  pairs = _answers(predicted, target)
  if not pairs:
    return 0.0
  return sum(len(p) == len(t) and bool(np.all(p == t)) for p, t in pairs) / len(pairs)
