"""`validate_config` parses every section of an experiment before anything is built: the
engine's (`train`, `eval`, `mesh`) and the fine-tuning ones (`backbone`, `method`)."""

import pytest

from sparse_jax.configs import default, spartan_stdlib
from sparse_jax.tasks import validate_config
from sparse_jax.validation import ConfigError


@pytest.mark.parametrize("path, value, message", [
    ("train.batch_size", 0, "'train.batch_size' must be a positive integer"),
    ("train.log_evry", 5, "'train.log_evry' is unknown; did you mean 'log_every'"),
    ("train.warmup_steps", 600, r"'train.warmup_steps' must be an integer in \[0, train.steps"),
    ("eval.max_examples", 0, "'eval.max_examples' must be a positive integer or None"),
    ("mesh.fsdp", 0, "'mesh.fsdp' must be a positive integer or -1"),
    ("backbone.kind", "bert", "'backbone.kind' must be one of"),
    ("method.kind", "lora", "'method.kind' must be one of"),
    ("method.spartan.top_k", 20, "'method.spartan.top_k' must be at most"),
    ("method.adapter.activation", "tanh", "'method.adapter.activation' must be one of"),
    ("method.adapter.init", "xavier", "'method.adapter.init' must be one of"),
    ("train.schedule", "constant", "'train.schedule' must be one of"),
])
def test_fine_tuning_sections_name_the_bad_field(path, value, message):
  config = spartan_stdlib.get_config()
  section, name = path.rsplit(".", 1)
  node = config
  for part in section.split("."):
    node = node[part]
  with node.unlocked():
    node[name] = value
  with pytest.raises(ConfigError, match=message):
    validate_config(config)


def test_an_unknown_section_is_named_with_the_nearest_one():
  config = default.get_config()
  with config.unlocked():
    config.evl = {"batch_size": 2}
  with pytest.raises(ConfigError, match="'evl' is unknown; did you mean 'eval'"):
    validate_config(config)


def test_defaults_come_from_the_schemas():
  typed = validate_config(spartan_stdlib.get_config())
  assert typed.method.spartan.n_parents == 16 and typed.method.adapter.bottleneck == 64
  # The SPARTAN reference's schedule (Hugging Face Trainer defaults) and temperature.
  assert (typed.train.schedule, typed.train.warmup_steps) == ("linear", 0)
  assert typed.method.spartan.temperature == 1.6
  assert (typed.mesh.data, typed.mesh.fsdp, typed.mesh.expert) == (-1, 1, 1)
