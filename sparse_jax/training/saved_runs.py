"""A training run's saved checkpoints, read back: its config, and its model in one call.

`load(workdir)` is what notebooks use to evaluate or sample from a run (`sparse_jax.load`);
`eval.py` scores a split through `evaluate_checkpoint`, which finds the step the same way.
"""

import ml_collections
from flax import nnx

from sparse_jax.training.checkpointing import Checkpointer, checkpoint_dir
from sparse_jax.training.tasks import task_for


class NoCheckpointError(FileNotFoundError):
  """The workdir holds no checkpoint (or not the requested step)."""


def saved_config(workdir: str, step: int | None = None
                 ) -> tuple[int, ml_collections.ConfigDict]:
  """`(step, config)` of checkpoint `step` (default: the latest) in `workdir`."""
  checkpointer = Checkpointer(workdir, read_only=True)
  try:
    steps = checkpointer.all_steps()
    if not steps:
      raise NoCheckpointError(f"no checkpoint in {checkpoint_dir(workdir)}: train first with "
                              f"`python train.py --workdir={workdir}`.")
    step = max(steps) if step is None else step
    if step not in steps:
      raise NoCheckpointError(f"no checkpoint of step {step} in {checkpoint_dir(workdir)}; "
                              f"available steps: {sorted(steps)}.")
    return step, checkpointer.restore_config(step)
  finally:
    checkpointer.close()


def load(workdir: str, step: int | None = None
         ) -> tuple[nnx.Module, ml_collections.ConfigDict]:
  """`(model, config)` of `workdir`'s checkpoint `step` (default: the latest).

  The model is rebuilt from the config saved with the checkpoint and its saved variables are
  restored into it, on the default device, in eval mode: a `TransformerLM` for a language
  model, a `Terraformer` for sequence to sequence, a `SequenceClassifier` for fine-tuning
  (the backbone rebuilt from `backbone`, the saved trainable part put on it). The config is
  the saved one (`config.train.steps` etc. as trained). Raises `NoCheckpointError` naming the
  directory and the steps there.
  """
  step, config = saved_config(workdir, step)
  return task_for(config).restore_model(workdir, step), config
