"""The copy/add length-generalisation data (Scaling Transformers Sec. 4.3, Table 4)."""

import numpy as np
import pytest

from sparse_jax.data import arithmetic
from sparse_jax.data.arithmetic import EOS, PAD, SEPARATOR, ArithmeticConfig
from sparse_jax.validation import ConfigError

SMALL = {"train_min_len": 2, "train_max_len": 12, "test_min_len": 20, "test_max_len": 30,
         "n_train": 64, "n_eval": 32, "seed": 3}


def config(task: str, **fields) -> ArithmeticConfig:
  return ArithmeticConfig.parse({"task": task, **SMALL, **fields}, "data")


def digits_of(tokens: np.ndarray) -> list[int]:
  """Token ids -> decimal digits, checking every token is a digit (ids 2..11)."""
  digits = [int(t) - 2 for t in tokens]
  assert all(0 <= d <= 9 for d in digits), tokens
  return digits


def value(lower_endian: list[int]) -> int:
  """The integer of lower-endian digits, with Python ints."""
  return sum(d * 10 ** i for i, d in enumerate(lower_endian))


def body(tokens: np.ndarray) -> np.ndarray:
  """The tokens before the single, final EOS."""
  assert tokens.dtype == np.int32 and tokens[-1] == EOS and (tokens[:-1] != EOS).all()
  assert (tokens != PAD).all()
  return tokens[:-1]


@pytest.mark.parametrize("task", ["copy", "add"])
def test_examples_are_a_function_of_seed_split_and_index(task):
  cfg = config(task)
  first = [arithmetic.example(cfg, "train", i) for i in (5, 0, 5)]
  np.testing.assert_array_equal(first[0]["inputs"], first[2]["inputs"])
  np.testing.assert_array_equal(first[0]["targets"], first[2]["targets"])
  source = arithmetic.ArithmeticSource(cfg, "train")
  assert len(source) == 64 and len(arithmetic.ArithmeticSource(cfg, "test")) == 32
  np.testing.assert_array_equal(source[5]["inputs"], first[0]["inputs"])
  other_seed = config(task, seed=4)
  assert any(not np.array_equal(arithmetic.example(cfg, "train", i)["inputs"],
                                arithmetic.example(other_seed, "train", i)["inputs"])
             for i in range(4))
  with pytest.raises(IndexError):
    arithmetic.example(cfg, "test", 32)


def test_validation_is_a_held_out_stream_of_the_train_distribution():
  cfg = config("copy")
  train = {tuple(arithmetic.example(cfg, "train", i)["inputs"]) for i in range(cfg.n_eval)}
  valid = [tuple(arithmetic.example(cfg, "validation", i)["inputs"]) for i in range(cfg.n_eval)]
  assert len(cfg.lengths("validation")) == 2 and cfg.size("validation") == cfg.n_eval
  assert sum(v in train for v in valid) < len(valid) // 4  # Not the train examples again.


@pytest.mark.parametrize("task", ["copy", "add"])
def test_digit_counts_cover_each_split_range(task):
  cfg = config(task)
  for split, (low, high) in (("train", (2, 12)), ("validation", (2, 12)), ("test", (20, 30))):
    counts = set()
    for i in range(cfg.size(split)):
      inputs = body(arithmetic.example(cfg, split, i)["inputs"])
      n_digits = int(np.sum(inputs != SEPARATOR))
      assert low <= n_digits <= high
      counts.add(n_digits)
    assert min(counts) <= low + 2 and max(counts) >= high - 2, (split, sorted(counts))


def test_copy_target_is_the_input():
  cfg = config("copy")
  for i in range(16):
    ex = arithmetic.example(cfg, "test", i)
    digits_of(body(ex["inputs"]))
    np.testing.assert_array_equal(ex["targets"], ex["inputs"])


def test_add_target_is_the_sum_lower_endian():
  """Operands and sum decoded with Python ints (up to 30 digits): target == a + b; no
  leading zeros (most significant digit last)."""
  cfg = config("add")
  for split in ("train", "test"):
    for i in range(cfg.size(split)):
      ex = arithmetic.example(cfg, split, i)
      inputs = body(ex["inputs"])
      assert np.sum(inputs == SEPARATOR) == 1
      sep = int(np.flatnonzero(inputs == SEPARATOR)[0])
      a, b = digits_of(inputs[:sep]), digits_of(inputs[sep + 1:])
      total = digits_of(body(ex["targets"]))
      for number in (a, b, total):
        assert len(number) >= 1 and (len(number) == 1 or number[-1] != 0)
      assert value(total) == value(a) + value(b)


def test_add_at_the_paper_test_lengths():
  """256-300 digits (the default test split): still a + b, with Python ints."""
  cfg = ArithmeticConfig.parse({"task": "add", "n_eval": 8}, "data")
  for i in range(8):
    ex = arithmetic.example(cfg, "test", i)
    inputs = body(ex["inputs"])
    sep = int(np.flatnonzero(inputs == SEPARATOR)[0])
    a, b = digits_of(inputs[:sep]), digits_of(inputs[sep + 1:])
    assert 256 <= len(a) + len(b) <= 300
    assert value(digits_of(body(ex["targets"]))) == value(a) + value(b)


def test_add_handles_a_carry_into_a_new_digit():
  """A hand-checked case through the helpers: 95 + 7 = 102, written lower-endian."""
  assert arithmetic.lower_endian_digits(95 + 7) == [2, 0, 1]
  assert arithmetic.lower_endian_value([5, 9]) == 95
  big = 10 ** 299 + 12345
  assert arithmetic.lower_endian_value(arithmetic.lower_endian_digits(big)) == big


@pytest.mark.parametrize("task", ["copy", "add"])
def test_padded_batches_have_the_split_shape(task):
  cfg = config(task)
  n_in, n_out = arithmetic.max_lengths(cfg, "test")
  assert (n_in, n_out) == (30 + (task == "add") + 1, 31)
  batch = arithmetic.padded_dataset(cfg, "test").batch(8)[1]
  assert batch["inputs"].shape == (8, n_in) and batch["targets"].shape == (8, n_out)
  for row, i in zip(batch["inputs"], range(8, 16)):
    unpadded = arithmetic.example(cfg, "test", i)["inputs"]
    np.testing.assert_array_equal(row[:len(unpadded)], unpadded)
    assert (row[len(unpadded):] == PAD).all()


def test_train_iterator_resumes_from_its_state():
  cfg = config("add")
  iterator = arithmetic.train_iterator(cfg, batch_size=4)
  next(iterator)
  state = iterator.get_state()
  expected = [next(iterator) for _ in range(2)]
  resumed = arithmetic.train_iterator(cfg, batch_size=4)
  resumed.set_state(state)
  for want in expected:
    got = next(resumed)
    np.testing.assert_array_equal(got["inputs"], want["inputs"])
    np.testing.assert_array_equal(got["targets"], want["targets"])
  assert want["inputs"].shape == (4, arithmetic.max_lengths(cfg, "train")[0])


def tokens(*digit_strings: str) -> list[np.ndarray]:
  """Rows of digit tokens then EOS; '.' stands for PAD after the EOS."""
  rows = []
  for s in digit_strings:
    body_, pads = s.rstrip("."), len(s) - len(s.rstrip("."))
    rows.append(np.array([int(c) + 2 for c in body_] + [EOS] + [PAD] * pads, np.int32))
  return rows


def test_metrics_on_hand_made_cases():
  target = tokens("123", "45", "6")
  assert arithmetic.per_digit_accuracy(target, target) == 1.0
  assert arithmetic.sequence_accuracy(target, target) == 1.0
  # One digit wrong in the first example: 5 of 6 positions, 2 of 3 sequences.
  predicted = tokens("193", "45", "6")
  assert arithmetic.per_digit_accuracy(predicted, target) == pytest.approx(5 / 6)
  assert arithmetic.sequence_accuracy(predicted, target) == pytest.approx(2 / 3)
  # Too short ("12" for "123": the missing digit is wrong) and too long ("457" for "45": the
  # extra digit is wrong): (2 + 2 + 1) right of (3 + 3 + 1) counted.
  predicted = tokens("12", "457", "6")
  assert arithmetic.per_digit_accuracy(predicted, target) == pytest.approx(5 / 7)
  assert arithmetic.sequence_accuracy(predicted, target) == pytest.approx(1 / 3)


def test_metrics_read_answers_up_to_eos_or_pad():
  """Padded [N, L] arrays work; tokens after EOS are ignored; a prediction without EOS is read
  to its first PAD or its end."""
  target = np.stack(tokens("123..", "45..."))
  predicted = np.array([[3, 4, 5, EOS, 9, 9], [6, 7, 8, 8, 8, 8]], np.int32)
  # Row 0: "123" right. Row 1 has no EOS: "45" then four extra 6s, 2 right of 6.
  assert arithmetic.per_digit_accuracy(predicted, target) == pytest.approx(5 / 9)
  assert arithmetic.sequence_accuracy(predicted, target) == pytest.approx(1 / 2)
  np.testing.assert_array_equal(arithmetic.answer(np.array([6, 7, PAD, 8])), [6, 7])
  with pytest.raises(ValueError, match="sequences"):
    arithmetic.per_digit_accuracy(predicted[:1], target)


@pytest.mark.parametrize("fields,field", [
    ({"train_max_len": 1, "train_min_len": 2}, "data.train_max_len"),
    ({"test_min_len": 310}, "data.test_max_len"),
    ({"train_min_len": 1}, "data.train_min_len"),
    ({"test_min_len": 0}, "data.test_min_len"),
    ({"n_eval": 0}, "data.n_eval"),
    ({"seed": -1}, "data.seed"),
    ({"task": "multiply"}, "data.task"),
    ({"train_max_len_": 3}, "data.train_max_len_"),
])
def test_config_errors_name_the_field(fields, field):
  cfg = {"task": "add", **fields}
  with pytest.raises(ConfigError, match=f"'{field}'"):
    ArithmeticConfig.parse(cfg, "data")


def test_config_defaults_are_the_paper_setting():
  cfg = ArithmeticConfig.parse({"task": "copy", "train_min_len": 1}, "data")
  assert cfg.lengths("train") == (1, 128) and cfg.lengths("test") == (256, 300)
  with pytest.raises(ConfigError, match="'data.task' is required"):
    ArithmeticConfig.parse({}, "data")
