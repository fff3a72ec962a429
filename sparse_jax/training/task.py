"""What a kind of training supplies to the engine (`sparse_jax.training.loop`).

The engine owns the loop, checkpoints, preemption, the NaN stop, logging on process 0 and the
mesh. A task owns everything that differs between language modelling, classification and
(later) sequence-to-sequence: its data, its model, its loss and metrics, what its checkpoint
holds and how it evaluates. Tasks live in `sparse_jax.tasks`.
"""

import abc
from collections.abc import Callable

import grain
import jax
import ml_collections
from flax import nnx

from sparse_jax import schema, validation
from sparse_jax.training.checkpointing import Checkpointer, ParamsItem
from sparse_jax.training.placement import Placement
from sparse_jax.training.steps import join_rows, split_rows


class Task(abc.ABC):
  """One kind of training over a validated experiment config.

  Constructing a task parses the whole config through the task's schema (`typed`; raises
  `ConfigError` naming the first bad field) and touches no file: data is read by `load_data`,
  models are built by `build`. `config` is kept as given; checkpoints store it resolved
  (`resolved_config`).
  """

  #: Name of the progress bar.
  name: str = "train"
  #: Name of the logged throughput metric.
  rate_name: str = "items_per_second"
  #: What checkpoints hold of the model.
  checkpoint_params: ParamsItem = ParamsItem()
  #: The schema of the whole experiment config (every section).
  experiment: type[schema.Schema]

  def __init__(self, config: ml_collections.ConfigDict):
    self.config = config
    self.typed = self.experiment.parse(config, "")

  @classmethod
  def resolve(cls, config: ml_collections.ConfigDict | dict) -> dict:
    """`config` with every default filled in, as plain values: what checkpoints store, and
    what resuming compares (a config file that restates a default equals one that omits it)."""
    return cls.experiment.parse(config, "").to_dict()

  def resolved_config(self) -> ml_collections.ConfigDict:
    """This task's config, resolved (`resolve`)."""
    return ml_collections.ConfigDict(self.typed.to_dict())

  @property
  def trainable(self) -> nnx.filterlib.Filter:
    """The NNX filter of the parameters that train (gradients and optimiser state)."""
    return nnx.Param

  @property
  @abc.abstractmethod
  def batch_size(self) -> int:
    """Rows of every global training batch."""

  @property
  @abc.abstractmethod
  def items_per_step(self) -> int:
    """What `rate_name` counts per step (tokens, examples)."""

  @abc.abstractmethod
  def flops_per_step(self, model: nnx.Module) -> int:
    """Model FLOPs of one training step of `model`, this task's model as built or abstract
    (`nnx.eval_shape`) (`models.accounting`): the logged `tflops_per_device` and `mfu`
    (`training.mfu`)."""

  def check_mesh(self, placement: Placement) -> None:
    """Raises `ConfigError` unless the task's batches split over the mesh."""
    placement.check_batch(self.batch_size, "train batch size")

  def check_accumulation(self, placement: Placement) -> None:
    """Raises `ConfigError` unless `train.grad_accum_steps` divides the training batch into
    micro-batches that each split over the mesh."""
    n = self.typed.train.grad_accum_steps
    validation.require(self.batch_size % n == 0, "train.grad_accum_steps",
                       f"a divisor of the training batch size ({self.batch_size})", n)
    if n > 1:
      placement.check_batch(self.batch_size // n,
                            f"the micro-batch (batch size / train.grad_accum_steps = {n})")

  @abc.abstractmethod
  def init_model_and_optimizer(self) -> tuple[nnx.Module, nnx.Optimizer]:
    """The model as initialised from the config alone (fine-tuning: a backbone of the
    pretrained one's shapes, not its weights) and its optimiser; reads no weights, so that
    `nnx.eval_shape` of it gives `build`'s shapes (`--compile_only`)."""

  def build(self, placement: Placement) -> tuple[nnx.Module, nnx.Optimizer]:
    """The model and its optimiser (state for `trainable` only), placed on the mesh."""
    return placement.create(self.init_model_and_optimizer)

  @abc.abstractmethod
  def batch_shapes(self) -> dict[str, jax.ShapeDtypeStruct]:
    """Shapes and dtypes of one global training batch, as `load_data`'s batches assemble."""

  @abc.abstractmethod
  def eval_step(self, model: nnx.Module, placement: Placement) -> tuple[Callable, tuple]:
    """The jitted step that `evaluate` runs, called as `step(nnx.state(model), *args)`, and
    the shapes of `args` in their shardings (`placement.batch_shapes`): what
    `--compile_only` compiles. `model` may hold shapes instead of arrays."""

  @abc.abstractmethod
  def new_model(self, placement: Placement | None = None) -> nnx.Module:
    """The model as initialised from the config (seed, backbone), created on `placement`'s
    mesh (None: on the default device)."""

  def restore_model(self, workdir: str, step: int,
                    placement: Placement | None = None) -> nnx.Module:
    """`new_model(placement)` with step `step`'s saved variables of `workdir` put in it
    (fine-tuning: the trainable part on the backbone), in eval mode."""
    model = self.new_model(placement)
    checkpointer = Checkpointer(workdir, params=self.checkpoint_params, read_only=True)
    try:
      checkpointer.restore_params(step, model)
    finally:
      checkpointer.close()
    model.eval()
    return model

  @abc.abstractmethod
  def load_data(self, placement: Placement) -> grain.DatasetIterator:
    """Reads the training and validation data; returns endless training batches (this
    process's rows of each global batch) from a checkpointable iterator."""

  def init_carry(self, model: nnx.Module, placement: Placement):
    """The state threaded through training steps (None: no carry)."""
    del model, placement
    return None

  def carry_shardings(self, placement: Placement):
    del placement
    return None

  def split_carry(self, carry, n: int):
    """The carry as `n` micro-batches on a new leading axis (`train.grad_accum_steps`), each
    holding the rows of `steps.split_rows`' micro-batch; by default every array's first axis
    is its batch axis."""
    return jax.tree.map(lambda x: split_rows(x, n), carry)

  def join_carry(self, carry_n):
    """The inverse of `split_carry`."""
    return jax.tree.map(join_rows, carry_n)

  def checkpoint_extras(self, carry) -> dict:
    """Named extra checkpoint items holding `carry` (item name -> pytree of arrays)."""
    del carry
    return {}

  def start(self, workdir: str, step: int) -> None:
    """Called once the run is built and restored, before its first step, with the run's folder
    and the step it starts from (0, or the restored checkpoint's): where a task rebuilds state
    it keeps across evaluations from what the run logged."""
    del workdir, step

  def carry_from_extras(self, extras: dict, carry):
    """The carry restored from `checkpoint_extras`' items."""
    del extras
    return carry

  @abc.abstractmethod
  def loss(self, model: nnx.Module, batch: dict[str, jax.Array], carry):
    """`(loss, (metrics, new_carry))` of one batch in training mode; traced under jit."""

  def log_metrics(self, metrics: dict[str, float]) -> dict[str, float]:
    """Metrics derived from a logging window's means, added to the train log."""
    del metrics
    return {}

  @abc.abstractmethod
  def evaluate(self, model: nnx.Module, placement: Placement) -> dict[str, float]:
    """Validation metrics of `model` (in eval mode) during training."""

  def finish(self, run, step: int) -> dict[str, float]:
    """Called once after the final evaluation (checkpoints written); returns extra final
    results."""
    del run, step
    return {}

  @abc.abstractmethod
  def evaluate_checkpoint(self, workdir: str, step: int, split: str,
                          max_batches: int | None) -> dict:
    """Rebuilds the model from the saved config, restores step `step`, scores `split`."""

  @abc.abstractmethod
  def param_report(self) -> dict:
    """Parameter counts and storage, as `train.py --print_params` prints them."""
