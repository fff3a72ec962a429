"""The training engine: one loop, checkpointer and step factory for every task.

Entry points: `training.loop.train_and_evaluate(config, workdir)` trains the task a config
selects (`training.tasks.task_for`: language modelling, or classification over a frozen
backbone); `training.evaluate_checkpoint.evaluate_checkpoint(workdir)` scores a saved run.
The engine's parts: `loop` (the loop and its `Run`), `task` (what a task supplies),
`checkpointing`, `steps` (the step factory), `optimizer`, `placement` (arrays on the mesh),
`metrics_writer`, `preemption`, `distributed`.

This namespace holds the engine's core only: `sparse_jax.finetune` builds on it and the
classification task builds on `finetune`, so importing the package must not import the tasks.
"""

from sparse_jax.training.checkpointing import Checkpointer, ParamsItem
from sparse_jax.training.steps import make_rngs, make_train_step

__all__ = ["Checkpointer", "ParamsItem", "make_rngs", "make_train_step"]
