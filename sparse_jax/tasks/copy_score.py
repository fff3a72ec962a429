"""In-context copying: has a language model learned to copy from its context, and has a
run stopped learning to?

**The score.** `repeated_slices` draws random slices of `half` tokens of a split, each
followed by itself; the model reads each `[rows, 2 * half]` sequence from an empty XL memory
(`copy_logits`), and `copy_bits` gives the mean bits per token of the first and the second
copy, leaving out each copy's first `skip` targets (the first copy's have almost no context;
the second copy's first target follows the join). On the first copy that is ordinary
prediction from a short context; on the second, every token is already in the context, and a
model that copies (induction heads: Olsson et al., 2022, "In-context learning and induction
heads") needs far fewer bits. `copy_ratio` = second / first: near 1 for a model that does not
copy, 0.27-0.56 for the `quality_medium` runs that learned to
(benchmarks/history/2026-11-28_quality_medium.md, "The copy probe").
`benchmarks/copy_probe.py` scores saved checkpoints with these functions; the language-model
task (`tasks.lm`) scores the model at every evaluation on fixed slices of its validation split
(`CopyScorer`), logged beside the loss.

**The stall.** 3 of the 12 `quality_medium` runs "stalled" just after the warm-up's peak and
never caught up, with no loss spike: each had a weak or missing copy mechanism.
`StallRule` tells them apart from the copy ratio of the evaluations so far; `StallDetector`
applies it to a run's evaluations as they come and fires once, at the first evaluation where
it holds (the task logs a warning naming the step, and `copy_stalled: 1` on that line).
"""

import contextlib
import dataclasses
import math
from collections.abc import Iterable

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

#: The probe's slices: `skip` = `half // SKIP_DIVISOR` (16 targets of 128) unless given.
SKIP_DIVISOR = 8
#: The seed of the slices a training run scores at every evaluation (the probe's default).
SLICE_SEED = 0
#: `StallRule`'s calibrated thresholds (its docstring): the defaults of `eval.copy_stall_ratio`
#: and `eval.copy_stall_drop` (`tasks.lm.LMEvalConfig`).
STALL_RATIO = 0.8
STALL_DROP = 0.1
#: The tokens a run trains before `eval.copy_stall_after_tokens` lets the rule judge it (the
#: default of that field): the `quality_medium` runs that learned to copy did so after 2-4M
#: tokens (steps 500-1000 of 4096 tokens), the stalled ones were told at 4.1M, and the embedded
#: default's 400 steps (0.8M) are too short to have learned it, stalled or not.
STALL_AFTER_TOKENS = 2_000_000


def default_skip(half: int) -> int:
  """Targets left out of each copy of `half` tokens: 1/8 of it (16 of 128), at least 1."""
  return max(1, half // SKIP_DIVISOR)


def repeated_slices(tokens: np.ndarray, rows: int, half: int, seed: int) -> np.ndarray:
  """`[rows, 2 * half]`: random slices of `tokens`, each followed by itself."""
  if len(tokens) < half:
    raise ValueError(f"half={half} is longer than the split ({len(tokens)} tokens)")
  starts = np.random.default_rng(seed).integers(0, len(tokens) - half + 1, rows)
  return np.stack([np.tile(tokens[s:s + half], 2) for s in starts])


def copy_nll(logits_btv: jax.Array, x_bt: jax.Array, skip: int) -> tuple[jax.Array, jax.Array]:
  """`copy_bits` as float32 arrays (traceable: what `CopyScorer` computes under jit)."""
  half = x_bt.shape[1] // 2
  logp_btv = jax.nn.log_softmax(jnp.asarray(logits_btv, jnp.float32), axis=-1)
  nll_bt = -jnp.take_along_axis(logp_btv, jnp.asarray(x_bt)[:, 1:, None], axis=-1)[..., 0]
  first = nll_bt[:, skip - 1:half - 1]
  second = nll_bt[:, half + skip - 1:]
  return first.mean() / math.log(2), second.mean() / math.log(2)


def copy_bits(logits_btv: jax.Array, x_bt: np.ndarray, skip: int) -> tuple[float, float]:
  """Mean bits per token of the first and the second copy in `x_bt` (`repeated_slices`),
  leaving out each copy's first `skip` targets. `logits_btv` are the predictions for
  `x_bt[:, 1:]` from `x_bt[:, :-1]`; target `j` of a copy is predicted at position `j - 1`."""
  first, second = copy_nll(logits_btv, x_bt, skip)
  return float(first), float(second)


def copy_logits(model: nnx.Module, x_bt: jax.Array, mem_len: int | None = None) -> jax.Array:
  """`model`'s predictions for `x_bt[:, 1:]`, reading `x_bt` from an empty XL memory of
  `mem_len` positions (None: the model's own). The whole of `x_bt` goes in (a training
  segment's length when `2 * half = data.seq_len`); the causal model's last prediction,
  past the sequence, is dropped."""
  logits_btv, _, _ = model(x_bt, model.init_memory(x_bt.shape[0], mem_len))
  return logits_btv[:, :-1]


def copy_metrics(first: float, second: float) -> dict[str, float]:
  """The logged names: `copy_first_bits`, `copy_second_bits` (bits per token on each copy)
  and `copy_ratio` (second / first)."""
  return {"copy_first_bits": first, "copy_second_bits": second, "copy_ratio": second / first}


class CopyScorer:
  """`copy_metrics` of models of one architecture on fixed slices, jitted once.

  `slices_bt` (`repeated_slices`) is placed once, replicated over `mesh` (default: on the
  default device); each call runs one forward pass of `[rows, 2 * half]` tokens and brings
  back two scalars.
  """

  def __init__(self, model: nnx.Module, slices_bt: np.ndarray, *, skip: int,
               mesh: jax.sharding.Mesh | None = None, mem_len: int | None = None):
    graphdef = nnx.graphdef(model)
    self.slices_bt = slices_bt
    self._mesh = mesh
    if mesh is None:
      self._x = jnp.asarray(slices_bt, jnp.int32)
    else:  # Every process holds the same slices.
      replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
      self._x = jax.make_array_from_callback(
          slices_bt.shape, replicated, lambda index: np.asarray(slices_bt, np.int32)[index])

    @jax.jit
    def score(state, x_bt):
      model = nnx.merge(graphdef, state)
      model.eval()
      return copy_nll(copy_logits(model, x_bt, mem_len), x_bt, skip)

    self._score = score

  def __call__(self, model: nnx.Module) -> dict[str, float]:
    with contextlib.nullcontext() if self._mesh is None else jax.set_mesh(self._mesh):
      first, second = jax.device_get(self._score(nnx.state(model), self._x))
    return copy_metrics(float(first), float(second))


@dataclasses.dataclass(frozen=True)
class StallRule:
  """When a run has stalled without learning to copy (`copy_stalled`).

  At an evaluation of step `s` with copy ratio `r`, the run has stalled when

  - `r >= ratio`: it still hardly copies (needs at least `ratio` of the first copy's bits on
    text it has just read), and
  - the ratio fell by less than `drop` since the latest earlier evaluation at a step in
    `[start, s - window]`: over at least `window` steps, all of them past `start` (the end of
    the warm-up), it has not started to copy. With no such evaluation yet, it is not judged;
  - `s >= judge_from`: the run has trained long enough to have learned copying (the task sets
    it from `eval.copy_stall_after_tokens`); before, a high ratio tells nothing.

  Calibration (`quality_medium`, benchmarks/history/2026-11-28_quality_medium.md: warm-up to
  step 400, an evaluation every 500 steps; `benchmarks/copy_probe*.json`, 16 slices of 128 bytes
  where training scores 8 by default). The stalled runs' ratios: 0.93 and 0.94 at step 1000,
  0.82 and 0.90 at step 1500 (two of the stalled seeds, rerun at half the peak learning rate:
  they stalled at the same steps), 0.92 at steps 3500 and 4000 (prose dense seed 2). The runs
  that did not stall: 0.78 at step 1000 (the slowest: a healthy seed at half the peak rate),
  0.44 at step 1500, 0.27-0.56 at step 4000. So `ratio` 0.8 sits between the healthy runs'
  highest ratio from step 1000 on and the stalled runs' lowest up to step 1500, and `drop` 0.1
  between what the two kinds lose over the first evaluation interval past the warm-up (steps 500
  to 1000): the probe was not taken at step 500, but there the builtin runs' training losses
  were within 0.4% of each other (they part from step 600), and a model that does not copy yet
  scores ~1 (0.98-1.0 at initialisation and in the tests' runs before they copy): from ~1, the
  healthy runs fell by >= ~0.2 and the stalled ones by <= ~0.07. With `window` and `start` at the
  warm-up (the defaults), the rule fires at step 1000 for the stalled seeds and never for the
  others (tests/tasks/test_copy_score.py replays these histories). Checked since at the
  recipe's own rate (`sparse_jax/configs/stall_medium.py`, `benchmarks/stall_sweep.json`): the stalled
  dense seed 1, rerun, 0.974 at step 500 and 0.924 at step 1000, fires at step 1000. The stalled runs do keep
  learning to copy, slowly (0.93 -> 0.82 over steps 1000-1500 for one; 0.52 and 0.56 at step
  4000 for two of them, as high as healthy prose runs), so the rule judges the first steps past
  the warm-up, where the runs part, and the final ratio alone does not tell a stalled run.
  """

  ratio: float
  drop: float
  window: int
  start: int
  judge_from: int = 0

  def stalled(self, history: list[tuple[int, float]]) -> bool:
    """Whether the rule holds at the last of `history`'s `(step, copy_ratio)` (by step)."""
    step, ratio = history[-1]
    if ratio < self.ratio or step < self.judge_from:
      return False
    earlier = [r for s, r in history[:-1] if self.start <= s <= step - self.window]
    return bool(earlier) and earlier[-1] - ratio < self.drop


class StallDetector:
  """Applies a `StallRule` to a run's evaluations as they come; fires once.

  `history` holds the `(step, copy_ratio)` of the evaluations so far (a resumed run rebuilds
  it with `from_records`); `fired_at` is the step it fired at, if it has.
  """

  def __init__(self, rule: StallRule, history: Iterable[tuple[int, float]] = (),
               fired_at: int | None = None):
    self.rule = rule
    self.history = sorted(history)
    self.fired_at = fired_at

  @classmethod
  def from_records(cls, rule: StallRule, records: Iterable[dict],
                   up_to_step: int | None = None) -> "StallDetector":
    """A detector that has seen the validation lines of `records` (a run's `metrics.jsonl`,
    `training.metrics_log.latest_records(read_metrics(workdir), "validation")`) up to step
    `up_to_step` (a resumed run's checkpoint: it evaluates the later steps again); fired
    already if one of them has `copy_stalled`."""
    kept = [r for r in records if "copy_ratio" in r
            and (up_to_step is None or r["step"] <= up_to_step)]
    fired = [r["step"] for r in kept if r.get("copy_stalled")]
    return cls(rule, [(r["step"], r["copy_ratio"]) for r in kept],
               fired[0] if fired else None)

  def update(self, step: int, copy_ratio: float) -> bool:
    """Adds the evaluation of `step`; True if the run has stalled there and the detector had
    not fired before (then it has now, at `step`)."""
    self.history = [h for h in self.history if h[0] < step] + [(step, copy_ratio)]
    if self.fired_at is not None or not self.rule.stalled(self.history):
      return False
    self.fired_at = step
    return True

  def message(self) -> str:
    """The warning of the step it fired at."""
    step, ratio = next(h for h in self.history if h[0] == self.fired_at)
    return (f"Step {step}: the model is not learning to copy from its context: copy_ratio "
            f"{ratio:.2f} (second over first copy of repeated validation text; ~1 means no "
            f"copying) is >= {self.rule.ratio} and fell by less than {self.rule.drop} since "
            f"an evaluation at least {self.rule.window} steps earlier, past the warm-up. Runs "
            f"that stall like this end well behind their twins (benchmarks/history/"
            f"2026-11-28_quality_medium.md): consider restarting with another seed "
            f"(sparse_jax.tasks.copy_score).")
