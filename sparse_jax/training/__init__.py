"""The training engine: one loop, checkpointer and step factory for every task.

`train_and_evaluate(config, workdir)` trains the task a config selects (`training.tasks`:
language modelling or classification over a frozen backbone); `evaluate_checkpoint` scores a
saved run. The engine's parts: `loop` (the loop and its `Run`), `checkpointing`, `steps` (the
step factory), `optimizer`, `placement` (arrays on the mesh), `metrics_writer`, `preemption`,
`distributed`.
"""

from sparse_jax.training.checkpointing import Checkpointer
from sparse_jax.training.evaluate_checkpoint import NoCheckpointError, evaluate_checkpoint
from sparse_jax.training.loop import NonFiniteLossError, train_and_evaluate
from sparse_jax.training.steps import make_rngs, make_train_step
from sparse_jax.training.tasks import Task, task_for

__all__ = ["Checkpointer", "NoCheckpointError", "NonFiniteLossError", "Task",
           "evaluate_checkpoint", "make_rngs", "make_train_step", "task_for",
           "train_and_evaluate"]
