"""Training library: optimiser, jitted steps, evaluation, checkpoints, the loop."""

from sparse_jax.training.checkpointing import Checkpointer
from sparse_jax.training.config_checks import validate_config
from sparse_jax.training.evaluation import Evaluator, lm_metrics
from sparse_jax.training.optimizer import learning_rate_schedule, make_optimizer
from sparse_jax.training.steps import cross_entropy, make_eval_step, make_rngs, make_train_step
from sparse_jax.training.trainer import NonFiniteLossError, build_model, train_and_evaluate

__all__ = ["Checkpointer", "Evaluator", "NonFiniteLossError", "build_model", "cross_entropy",
           "learning_rate_schedule", "lm_metrics", "make_eval_step", "make_optimizer",
           "make_rngs", "make_train_step", "train_and_evaluate", "validate_config"]
