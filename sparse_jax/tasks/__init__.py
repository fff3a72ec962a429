"""The tasks on top of the engine (`sparse_jax.training`): language modelling
(`tasks.lm`), classification over a frozen backbone (`tasks.classification`, with
`tasks.backbones`) and sequence to sequence (`tasks.seq2seq`); which one a config selects
(`tasks.selection`); and runs of them: train, load, evaluate (`tasks.runs`), over several
seeds (`tasks.seed_runs`).
"""

from sparse_jax.tasks.classification import ClassificationTask
from sparse_jax.tasks.lm import LanguageModelTask
from sparse_jax.tasks.runs import evaluate_checkpoint, load, saved_config, train_and_evaluate
from sparse_jax.tasks.selection import task_class, task_for, validate_config
from sparse_jax.tasks.seq2seq import Seq2SeqTask

__all__ = ["ClassificationTask", "LanguageModelTask", "Seq2SeqTask", "evaluate_checkpoint",
           "load", "saved_config", "task_class", "task_for", "train_and_evaluate",
           "validate_config"]
