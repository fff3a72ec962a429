"""Sequence to sequence: a Terraformer on (inputs, targets) pairs (Scaling Transformers Sec. 4).

Config sections: `data` (`sparse_jax.data.seq2seq`: `name` "arithmetic" or "arxiv", and
`batch_size`), `model` (`models.terraformer`), `train`, `eval` (`batch_size`, `max_examples`
scored by greedy decoding, `max_batches` of teacher-forced loss), `mesh`. The loss is the
cross-entropy of the target tokens (PAD excluded) plus the FF regularisers. Evaluation reports
the teacher-forced loss and token accuracy, and the dataset's own scores of greedy answers
(per-digit and sequence accuracy for copy/add, ROUGE for arXiv); `eval.py` does the same on a
whole split.
"""


import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from flax import nnx

from sparse_jax import parallel, schema, validation
from sparse_jax.data import task_batches
from sparse_jax.data.seq2seq import Seq2SeqDataConfig
from sparse_jax.models.accounting import terraformer_step_flops
from sparse_jax.models.rngs import make_rngs
from sparse_jax.models.terraformer import PAD, Terraformer
from sparse_jax.models.terraformer_config import TerraformerConfig
from sparse_jax.training.optimizer import TrainConfig, make_optimizer
from sparse_jax.training.placement import Placement
from sparse_jax.training.task import Task


class Seq2SeqEvalConfig(schema.Schema):
  """The `eval` section: batches of `batch_size`; the teacher-forced loss over `max_batches`
  (None: the whole split) and greedy answers scored over `max_examples` (None: all)."""

  batch_size: schema.PositiveInt
  max_batches: schema.PositiveInt | None = None
  max_examples: schema.NonNegativeInt | None = 64


class Seq2SeqExperiment(schema.Schema):
  """A sequence-to-sequence config (module docstring), typed."""

  seed: int = 0  # Of the model's init and of its dropout and routing streams.
  data: Seq2SeqDataConfig
  model: TerraformerConfig
  train: TrainConfig
  eval: Seq2SeqEvalConfig
  mesh: parallel.MeshConfig

  def check(self, path: str) -> None:
    del path
    self.mesh.require_unsplit_model("the seq2seq Terraformer")
    vocab = self.data.load().vocab_size
    validation.require(self.model.vocab_size >= vocab, "model.vocab_size",
                       f">= the vocabulary of data.name={self.data.name!r} ({vocab})",
                       self.model.vocab_size)


def target_loss(logits_btv: jax.Array, targets_bt: jax.Array):
  """`(mean cross-entropy, token accuracy)` over the non-PAD target tokens."""
  logp_btv = jax.nn.log_softmax(logits_btv.astype(jnp.float32), axis=-1)
  nll_bt = -jnp.take_along_axis(logp_btv, targets_bt[..., None], axis=-1)[..., 0]
  weights_bt = (targets_bt != PAD).astype(jnp.float32)
  n = jnp.maximum(weights_bt.sum(), 1.0)
  right_bt = (jnp.argmax(logits_btv, -1) == targets_bt).astype(jnp.float32)
  return (nll_bt * weights_bt).sum() / n, (right_bt * weights_bt).sum() / n


def build_model(config: Seq2SeqExperiment) -> Terraformer:
  return Terraformer(config.model, rngs=make_rngs(config.seed, config.train.rng_impl))


class Seq2SeqTask(Task):
  """Teacher-forced training of a `Terraformer`; greedy decoding to evaluate."""

  name = "seq2seq"
  rate_name = "target_tokens_per_second"
  experiment = Seq2SeqExperiment

  def __init__(self, config: ml_collections.ConfigDict):
    super().__init__(config)
    self.data = self.typed.data.load()
    self._valid, self._steps = None, {}

  @property
  def batch_size(self) -> int:
    return self.typed.data.batch_size

  @property
  def items_per_step(self) -> int:
    return self.batch_size * self.data.max_lengths("train")[1]

  def flops_per_step(self, model: Terraformer) -> int:
    return terraformer_step_flops(model, self.batch_size, *self.data.max_lengths("train"))

  def check_mesh(self, placement: Placement) -> None:
    placement.check_batch(self.typed.data.batch_size, "data.batch_size")
    placement.check_batch(self.typed.eval.batch_size, "eval.batch_size")

  def init_model_and_optimizer(self):
    model = build_model(self.typed)
    return model, nnx.Optimizer(model, make_optimizer(self.typed.train), wrt=nnx.Param)

  def batch_shapes(self) -> dict[str, jax.ShapeDtypeStruct]:
    return self._padded_batch(self.batch_size)

  def _padded_batch(self, batch_size: int) -> dict[str, jax.ShapeDtypeStruct]:
    """`inputs [B, S]` and `targets [B, T]`, padded to the training maxima."""
    n_inputs, n_targets = self.data.max_lengths("train")
    return {"inputs": jax.ShapeDtypeStruct((batch_size, n_inputs), jnp.int32),
            "targets": jax.ShapeDtypeStruct((batch_size, n_targets), jnp.int32)}

  def eval_step(self, model: Terraformer, placement: Placement):
    """The teacher-forced loss step (greedy decoding is compiled per answer length)."""
    batch = placement.batch_shapes(self._padded_batch(self.typed.eval.batch_size))
    return _make_eval_step(nnx.graphdef(model)), (batch,)

  def new_model(self, placement: Placement | None = None) -> Terraformer:
    build = lambda: build_model(self.typed)  # noqa: E731
    return build() if placement is None else placement.create(build)

  def load_data(self, placement: Placement):
    self._valid = self.data.eval_arrays("validation", self._eval_rows())
    iterator = self.data.train_iterator(self.batch_size, placement.local_rows(self.batch_size))
    return iterator

  def _eval_rows(self) -> int | None:
    """Validation examples needed: the loss batches' and the decoded examples' maximum."""
    cfg = self.typed.eval
    if cfg.max_batches is None:
      return None
    return max(cfg.max_batches * cfg.batch_size, cfg.max_examples or 0)

  def loss(self, model: Terraformer, batch, carry):
    logits_btv, aux = model(batch["inputs"], batch["targets"])
    ce, accuracy = target_loss(logits_btv, batch["targets"])
    return ce + aux["reg_loss"], ({"ce": ce, "token_accuracy": accuracy,
                                   "reg_loss": aux["reg_loss"]}, carry)

  def evaluate(self, model: Terraformer, placement: Placement) -> dict[str, float]:
    return self._score(model, placement, self._valid, "validation")

  def _score(self, model, placement: Placement, arrays, split: str) -> dict[str, float]:
    """Teacher-forced loss and accuracy over `max_batches`, then greedy answers of the first
    `max_examples` scored by the dataset."""
    cfg = self.typed.eval
    graphdef, state = nnx.split(model)
    target_len = arrays["targets"].shape[1]
    if target_len not in self._steps:  # Compiled once per run and answer length.
      self._steps[target_len] = (_make_eval_step(graphdef),
                                 _make_decode_step(graphdef, target_len))
    teacher_forced, decode = self._steps[target_len]
    sums, n_batches = np.zeros(2), 0
    with jax.set_mesh(placement.mesh):
      for batch in task_batches.eval_batches(arrays, cfg.batch_size):
        if cfg.max_batches is not None and n_batches == cfg.max_batches:
          break
        weights = batch.pop("weights")
        if weights.min() == 0:  # A padded last batch would weigh its repeats.
          break
        sums += np.asarray(teacher_forced(state, placement.global_batch(batch, cfg.batch_size)))
        n_batches += 1
      n_decode = len(arrays["inputs"]) if cfg.max_examples is None else min(
          cfg.max_examples, len(arrays["inputs"]))
      answers = [np.asarray(decode(state, jnp.asarray(arrays["inputs"][i:i + cfg.batch_size])))
                 for i in range(0, n_decode, cfg.batch_size)]
    metrics = {}
    if n_batches:
      metrics.update(ce=sums[0] / n_batches, token_accuracy=sums[1] / n_batches)
    if n_decode:
      metrics.update(self.data.score(np.concatenate(answers)[:n_decode], split, n_decode))
    return metrics

  def evaluate_checkpoint(self, workdir: str, step: int, split: str,
                          max_batches: int | None) -> dict:
    """Restores step `step` and scores `split` (`max_batches` None: the whole split's loss)."""
    placement = Placement(parallel.mesh_from_config(self.typed.mesh))
    model = self.restore_model(workdir, step, placement)
    n_rows = None if max_batches is None else max(max_batches * self.typed.eval.batch_size,
                                                  self.typed.eval.max_examples or 0)
    arrays = self.data.eval_arrays(split, n_rows)
    return self._score(model, placement, arrays, split)

  def param_report(self) -> dict:
    """Parameters of the whole model, the encoder's and the decoder's sublayers."""
    model = nnx.eval_shape(lambda: build_model(self.typed))

    def count(node) -> int:
      return sum(x.size for x in jax.tree.leaves(nnx.state(node, nnx.Param)))

    return {"params": count(model), "encoder_params": count(model.encoder),
            "decoder_params": count(model.decoder)}


def _make_eval_step(graphdef: nnx.GraphDef):
  """`(state, batch) -> [ce, token accuracy]` in eval mode."""

  @jax.jit
  def step(state, batch):
    model = nnx.merge(graphdef, state)
    model.eval()
    logits_btv, _ = model(batch["inputs"], batch["targets"])
    return jnp.stack(target_loss(logits_btv, batch["targets"]))

  return step


def _make_decode_step(graphdef: nnx.GraphDef, max_target_len: int):
  """`(state, inputs [B, S]) -> greedy answers [B, max_target_len]` in eval mode."""

  @jax.jit
  def decode(state, inputs_bs):
    model = nnx.merge(graphdef, state)
    model.eval()
    return model.greedy_decode(inputs_bs, max_target_len)

  return decode
