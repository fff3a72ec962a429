"""Language modelling: a `TransformerLM` on contiguous token streams, carrying XL memory.

Config sections: `data` (`sparse_jax.data`), `model` (`models.lm`), `train`, `eval`
(`batch_size`, `mem_len`, `max_batches`, the `copy_*` fields of `LMEvalConfig`), `mesh`.
Step t reads segment t of each of the `data.batch_size` streams, so the memory carried from
step to step (and saved in every checkpoint as the item `memory`) holds the real preceding
text.

Every evaluation during training also scores in-context copying on fixed repeated slices of
the validation split (`tasks.copy_score`: `copy_ratio`, `copy_first_bits`,
`copy_second_bits` on the validation line) and warns once, with `copy_stalled: 1` on that
line, when the run has stalled without learning to copy (`copy_score.StallRule`).
"""


import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from absl import logging
from flax import nnx

from sparse_jax import data, parallel, schema, validation
from sparse_jax.data.datasets import DataConfig
from sparse_jax.data.sources import BadSourceError
from sparse_jax.models.accounting import attention_report, lm_step_flops, model_report
from sparse_jax.models.lm import TransformerLM
from sparse_jax.models.lm_config import XL_KINDS, LMConfig
from sparse_jax.models.rngs import make_rngs
from sparse_jax.models.tensor_support import check_tensor_parallel
from sparse_jax.models.xl_memory import XLMemory
from sparse_jax.tasks import copy_score
from sparse_jax.tasks.lm_evaluation import (Evaluator, cross_entropy, make_eval_step,
                                                    unit_metric)
from sparse_jax.training import metrics_log, routing_health
from sparse_jax.training.optimizer import TrainConfig, make_optimizer
from sparse_jax.training.placement import Placement
from sparse_jax.training.steps import join_rows, split_rows
from sparse_jax.training.task import Task


class LMEvalConfig(schema.Schema):
  """The `eval` section: `batch_size` streams with XL memory of `mem_len` positions (the
  paper: 4x the training context); `max_batches` None evaluates the whole split.

  The copy score of every evaluation during training (`tasks.copy_score`): `copy_rows`
  random slices of `copy_half` validation tokens (None: `data.seq_len // 2`, so both copies
  fill one training segment), each followed by itself, drawn once per run; 0 rows: no score
  and no stall warning. The stall warning (`copy_score.StallRule`) fires when the copy ratio
  is still >= `copy_stall_ratio` (None: never warn) and fell by less than `copy_stall_drop`
  over at least `copy_stall_window` steps (None: `train.warmup_steps`) past the warm-up, once
  the run has trained `copy_stall_after_tokens` tokens (`copy_score.STALL_AFTER_TOKENS`):
  a shorter run has not had the data to learn copying, so its ratio tells nothing.
  """

  batch_size: schema.PositiveInt
  mem_len: schema.NonNegativeInt
  max_batches: schema.PositiveInt | None = None
  copy_rows: schema.NonNegativeInt = 8
  copy_half: schema.PositiveInt | None = None
  copy_stall_ratio: schema.PositiveFloat | None = copy_score.STALL_RATIO
  copy_stall_drop: schema.NonNegativeFloat = copy_score.STALL_DROP
  copy_stall_window: schema.NonNegativeInt | None = None
  copy_stall_after_tokens: schema.NonNegativeInt = copy_score.STALL_AFTER_TOKENS


class LMExperiment(schema.Schema):
  """A language-model config (module docstring), typed."""

  seed: int = 0  # Of the model's init and of its dropout and routing streams.
  data: DataConfig
  model: LMConfig
  train: TrainConfig
  eval: LMEvalConfig
  mesh: parallel.MeshConfig

  def check(self, path: str) -> None:
    check_tensor_parallel(self.model, self.mesh.tensor)
    if self.model.sequence_parallel:
      self._check_sequence_parallel()
    vocab = self.data.spec().vocab_size
    validation.require(self.model.vocab_size >= vocab, "model.vocab_size",
                       f">= the vocabulary of data.name={self.data.name!r} ({vocab})",
                       self.model.vocab_size)
    if self.eval.copy_rows:
      validation.require(
          2 <= self.copy_half <= self.data.seq_len // 2, "eval.copy_half",
          f"in [2, data.seq_len // 2 = {self.data.seq_len // 2}] (both copies in one training "
          f"segment), or eval.copy_rows=0 to score no copying", self.copy_half)

  def _check_sequence_parallel(self) -> None:
    """The segment and the XL memories are split along the sequence over `mesh.tensor`."""
    lengths = {"data.seq_len": self.data.seq_len}
    if self.model.attention in XL_KINDS:
      lengths.update({"model.mem_len": self.model.mem_len, "eval.mem_len": self.eval.mem_len})
    for field, length in lengths.items():
      validation.require(length % self.mesh.tensor == 0, field,
                         f"divisible by mesh.tensor={self.mesh.tensor} with "
                         "model.sequence_parallel (split along the sequence)", length)


  @property
  def copy_half(self) -> int:
    """Tokens per copy of the copy score: `eval.copy_half`, by default half a segment."""
    return self.eval.copy_half or self.data.seq_len // 2

  def stall_rule(self) -> copy_score.StallRule | None:
    """The copy-stall rule of `eval.copy_stall_*` (None: no warning)."""
    cfg = self.eval
    if not cfg.copy_rows or cfg.copy_stall_ratio is None:
      return None
    window = self.train.warmup_steps if cfg.copy_stall_window is None else cfg.copy_stall_window
    tokens_per_step = self.data.batch_size * self.data.seq_len
    return copy_score.StallRule(ratio=cfg.copy_stall_ratio, drop=cfg.copy_stall_drop,
                                window=window, start=self.train.warmup_steps,
                                judge_from=-(-cfg.copy_stall_after_tokens // tokens_per_step))


def build_model(config) -> TransformerLM:
  """The LM of a config (ConfigDict or `LMExperiment`), initialised from its seed, its
  training streams in `train.rng_impl`."""
  rng_impl = TrainConfig.parse(config.train, "train").rng_impl
  return TransformerLM(config.model, rngs=make_rngs(config.seed, rng_impl))


def build_model_and_optimizer(config):
  """The model and its optimiser (state for `nnx.Param`s only)."""
  model = build_model(config)
  return model, nnx.Optimizer(model, make_optimizer(TrainConfig.parse(config.train, "train")),
                              wrt=nnx.Param)


def make_evaluator(config: LMExperiment, model: TransformerLM,
                   placement: Placement | None = None) -> Evaluator:
  return Evaluator(model, batch_size=config.eval.batch_size, seq_len=config.data.seq_len,
                   mem_len=config.eval.mem_len, unit=config.data.spec().unit,
                   placement=placement)


def _require_one_segment(n_tokens: int, cfg: DataConfig, split: str, batch_size: int,
                         batch_field: str) -> None:
  """Raises `BadSourceError` unless a split fills one segment of `batch_size` streams
  (`lm_stream`: each stream needs seq_len + 1 tokens), before any step runs."""
  needed = batch_size * (cfg.seq_len + 1)
  if n_tokens < needed:
    raise BadSourceError(
        f"the {split} split of data.name={cfg.name!r} has {n_tokens} tokens, fewer than one "
        f"segment needs: {batch_field}={batch_size} streams of data.seq_len + 1 = "
        f"{cfg.seq_len + 1} tokens ({needed}). Give more text, or lower {batch_field} or "
        f"data.seq_len.")


def _token_batch(batch_size: int, seq_len: int) -> dict[str, jax.ShapeDtypeStruct]:
  """`inputs` and `targets`, `[batch_size, seq_len]` token ids (`lm_stream`)."""
  tokens = jax.ShapeDtypeStruct((batch_size, seq_len), jnp.int32)
  return {"inputs": tokens, "targets": tokens}


class LanguageModelTask(Task):
  """Next-token prediction; the loss is the mean cross-entropy plus the FF regularisers."""

  rate_name = "tokens_per_second"
  experiment = LMExperiment

  def __init__(self, config: ml_collections.ConfigDict):
    super().__init__(config)
    self.unit = self.typed.data.spec().unit
    self._valid, self._evaluator = None, None
    self._copy_slices, self._copy_scorer = None, None  # `load_data`, the first `evaluate`.
    self._optimizer = None  # `build`'s: its step is the step of each evaluation.
    rule = self.typed.stall_rule()
    self._stall = None if rule is None else copy_score.StallDetector(rule)

  @property
  def batch_size(self) -> int:
    return self.typed.data.batch_size

  @property
  def items_per_step(self) -> int:
    return self.typed.data.batch_size * self.typed.data.seq_len

  def flops_per_step(self, model: TransformerLM) -> int:
    return lm_step_flops(model, self.typed.data.batch_size, self.typed.data.seq_len)

  def check_mesh(self, placement: Placement) -> None:
    placement.check_batch(self.typed.data.batch_size, "data.batch_size")
    placement.check_batch(self.typed.eval.batch_size, "eval.batch_size")
    placement.check_experts(self.typed.model.ff)
    check_tensor_parallel(self.typed.model, parallel.axis_size(placement.mesh, parallel.TENSOR))

  def load_data(self, placement: Placement):
    cfg = self.typed.data
    self._valid = data.load_split(cfg, "validation")
    train_tokens = data.load_tokens(cfg, "train")
    _require_one_segment(len(train_tokens), cfg, "train", cfg.batch_size, "data.batch_size")
    _require_one_segment(len(self._valid.tokens), cfg, "validation", self.typed.eval.batch_size,
                         "eval.batch_size")
    if self.typed.eval.copy_rows:  # Fits: copy_half <= seq_len // 2 (`LMExperiment.check`).
      self._copy_slices = copy_score.repeated_slices(
          self._valid.tokens, self.typed.eval.copy_rows, self.typed.copy_half,
          copy_score.SLICE_SEED)
    return data.train_iterator(train_tokens, cfg.batch_size, cfg.seq_len,
                               placement.data_shard(cfg.batch_size))

  def init_model_and_optimizer(self):
    return build_model_and_optimizer(self.typed)

  def build(self, placement: Placement) -> tuple[TransformerLM, nnx.Optimizer]:
    """`Task.build`, keeping the optimiser: the engine puts its state back into it before
    each evaluation, so its step count is the step being evaluated (the copy-stall warning
    names it)."""
    model, self._optimizer = super().build(placement)
    return model, self._optimizer

  def start(self, workdir: str, step: int) -> None:
    """A resumed run's copy-stall detector, rebuilt from the validation lines it logged up to
    its checkpoint's `step` (later ones are evaluated again), so that it judges the next
    evaluation against the earlier ones and fires at most once per run."""
    if self._stall is None or not step:
      return
    try:
      records = metrics_log.latest_records(metrics_log.read_metrics(workdir), "validation")
    except FileNotFoundError:
      return
    self._stall = copy_score.StallDetector.from_records(self._stall.rule, records, step)

  def batch_shapes(self) -> dict[str, jax.ShapeDtypeStruct]:
    return _token_batch(self.typed.data.batch_size, self.typed.data.seq_len)

  def eval_step(self, model: TransformerLM, placement: Placement):
    cfg = self.typed.eval
    memory = jax.eval_shape(lambda: model.init_memory(cfg.batch_size, cfg.mem_len))
    memory = placement.placed_shapes(
        memory, placement.memory_shardings(self.typed.model.sequence_parallel))
    batch = placement.batch_shapes(_token_batch(cfg.batch_size, self.typed.data.seq_len))
    return make_eval_step(nnx.graphdef(model)), (memory, batch)

  def new_model(self, placement: Placement | None = None) -> TransformerLM:
    build = lambda: build_model(self.typed)  # noqa: E731
    return build() if placement is None else placement.create(build)

  def init_carry(self, model: TransformerLM, placement: Placement) -> XLMemory:
    return placement.create_memory(lambda: model.init_memory(self.batch_size),
                                   self.typed.model.sequence_parallel)

  def carry_shardings(self, placement: Placement) -> XLMemory:
    return placement.memory_shardings(self.typed.model.sequence_parallel)

  def split_carry(self, memory: XLMemory, n: int) -> XLMemory:
    """Each micro-batch's streams keep their own memory rows (batch axis 1)."""
    return XLMemory(split_rows(memory.hidden_lbmd, n, axis=1),
                    jnp.broadcast_to(memory.valid, (n,)))

  def join_carry(self, memory_n: XLMemory) -> XLMemory:
    return XLMemory(join_rows(memory_n.hidden_lbmd, axis=1), memory_n.valid[-1])

  def checkpoint_extras(self, memory: XLMemory) -> dict:
    """The XL memory as the item `memory`; nothing for attention without one (Orbax refuses
    the empty `[L, B, 0, d]` array)."""
    if memory.hidden_lbmd.size == 0:
      return {}
    return {"memory": {"hidden": memory.hidden_lbmd, "valid": memory.valid}}

  def carry_from_extras(self, extras: dict, memory: XLMemory) -> XLMemory:
    if "memory" not in extras:
      return memory
    return XLMemory(extras["memory"]["hidden"], extras["memory"]["valid"])

  def loss(self, model: TransformerLM, batch, memory: XLMemory):
    logits, new_memory, aux = model(batch["inputs"], memory)
    nll_sum, n_tokens = cross_entropy(logits, batch["targets"])
    ce = nll_sum / n_tokens
    metrics = {"ce": ce, "reg_loss": aux["reg_loss"], **routing_health.step_metrics(aux)}
    return ce + aux["reg_loss"], (metrics, new_memory)

  def log_metrics(self, metrics: dict[str, float]) -> dict[str, float]:
    return unit_metric(metrics["ce"], self.unit)

  def evaluate(self, model: TransformerLM, placement: Placement) -> dict[str, float]:
    """The loss over the validation split (`eval.max_batches` segments) and, unless
    `eval.copy_rows=0`, the copy score with `copy_stalled: 1.0` where the run stalled."""
    if self._evaluator is None:
      self._evaluator = make_evaluator(self.typed, model, placement)
    metrics = self._evaluator(model, self._valid.tokens, max_batches=self.typed.eval.max_batches,
                              words_per_token=self._valid.words_per_token)
    if self._copy_slices is not None:
      if self._copy_scorer is None:
        self._copy_scorer = copy_score.CopyScorer(
            model, self._copy_slices, skip=copy_score.default_skip(self.typed.copy_half),
            mesh=placement.mesh)
      metrics.update(self._copy_scorer(model))
      metrics.update(self._check_stall(metrics["copy_ratio"]))
    return metrics

  def _check_stall(self, copy_ratio: float) -> dict[str, float]:
    """`copy_stalled: 1.0` (and a warning naming the step) the first time the run has
    stalled; nothing without a training run's optimiser (a model evaluated on its own)."""
    if self._stall is None or self._optimizer is None:
      return {}
    step = int(np.asarray(self._optimizer.step.get_value().addressable_data(0)))
    if not self._stall.update(step, copy_ratio):
      return {}
    if jax.process_index() == 0:
      logging.warning("%s", self._stall.message())
    return {"copy_stalled": 1.0}

  def evaluate_checkpoint(self, workdir: str, step: int, split: str,
                          max_batches: int | None) -> dict:
    """Restores the model sharded onto the saved config's mesh; evaluates with the saved
    `eval.mem_len`. Token (SentencePiece) datasets report perplexity per token and per word."""
    placement = Placement(parallel.mesh_from_config(self.typed.mesh))
    model = self.restore_model(workdir, step, placement)
    loaded = data.load_split(self.typed.data, split)
    metrics = make_evaluator(self.typed, model, placement)(
        model, loaded.tokens, max_batches=max_batches, words_per_token=loaded.words_per_token)
    return {"mem_len": self.typed.eval.mem_len, **metrics}

  def param_report(self) -> dict:
    return {**model_report(self.typed.model),
            **attention_report(self.typed.model, self.typed.data.seq_len)}
