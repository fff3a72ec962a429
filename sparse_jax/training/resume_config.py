"""Which config changes a run may resume with.

A checkpoint holds the config it was trained with. Re-running `train.py` on the same workdir
with an edited config resumes only if the edit leaves the model, its data and its optimiser
state meaning what they meant: the fields in `SAFE_TO_CHANGE` (how long to train, the
learning-rate schedule, logging, profiling, checkpoint and evaluation cadence, evaluation
settings, the device mesh, gradient accumulation, rematerialisation, scanned layers, and where
data lives) may change; any other difference (shapes, kinds, compute dtype, vocabulary,
dataset, batch size, seed, optimiser kind, backbone, fine-tuning method) is refused with every
differing field named, before anything is restored.

A saved config lacks the fields added after it was saved; `with_fields_added_since` gives them
the values that rebuild what it trained, which later defaults need not be.
"""

import json
from typing import Any

import ml_collections

from sparse_jax.validation import ConfigError

# Dotted config paths (a prefix covers its whole section) that may differ on resume.
SAFE_TO_CHANGE = (
    "train.steps", "train.schedule_steps", "train.lr", "train.warmup_steps", "train.schedule",
    "train.grad_clip", "train.adam_b1", "train.adam_b2", "train.adam_eps",
    "train.weight_decay", "train.end_lr_fraction",
    "train.log_every", "train.eval_every", "train.ckpt_every", "train.keep_checkpoints",
    "train.profile_steps", "train.grad_accum_steps", "model.remat", "model.scan_layers",
    "eval", "mesh",
    "data.data_dir", "data.manual_dir", "data.download", "task.data_dir",
)


# Fields added after checkpoints were saved without them, with the values that rebuild what
# those checkpoints trained: {(section, field naming its kind, kind): {field: value before}}.
FIELDS_ADDED_LATER = {
    ("model", "kind", "terraformer"): {  # Trax's options (docs/scaling_transformers.md).
        "positions": "sinusoid", "embedding_init": "normal", "shared_dropout": False,
        "ff_dropout": None, "attention_bias": False, "reversible_encoder": False},
    ("data", "name", "arxiv"): {"article_end": "eos"},
    ("model", "kind", "lm"): {  # SwitchHead attention's fields (docs/switchhead.md).
        "attention_experts": None, "attention_k": None, "attention_impl": "auto",
        "layer_groups": None, "block_norm": "pre", "moeut_ff_reg": 0.0,  # MoEUT's.
        "moeut_attention_reg": 0.0, "rotary_fraction": None,
        "attention_core": "auto",  # The causal kinds' attention core (issue 60).
        "embed_init": "normal",  # The only token embedding before the option (issue 61).
        # The recipe study's options (issue 73), at the values that had no option before.
        "embed_init_scale": 1.0, "embed_multiplier": 1.0, "residual_init_scale": 1.0,
        "xl_bias_init_std": 0.0},
}


def with_fields_added_since(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """`config` (a saved one) with each field of `FIELDS_ADDED_LATER` it lacks set to its
  value before; the schemas' defaults for them may differ (a Terraformer's positions:
  sinusoids before, fixed-base now)."""
  for (section, kind_field, kind), fields in FIELDS_ADDED_LATER.items():
    node = config.get(section)
    if node is None or node.get(kind_field) != kind:
      continue
    with node.unlocked():
      for name, value in fields.items():
        if name not in node:
          node[name] = value
  return config


def _flat(tree: Any, prefix: str = "") -> dict[str, Any]:
  """`{"model.ff.kind": "sigma_moe", ...}` of a nested dict (sub-dicts flattened)."""
  if not isinstance(tree, dict):
    return {prefix: tree}
  flat = {}
  for key, value in tree.items():
    flat.update(_flat(value, f"{prefix}.{key}" if prefix else str(key)))
  return flat


def _as_saved(config: ml_collections.ConfigDict | dict) -> dict:
  """The config as its checkpoint stores it (JSON: tuples become lists)."""
  tree = config.to_dict() if isinstance(config, ml_collections.ConfigDict) else config
  return json.loads(json.dumps(tree))


def is_safe(path: str) -> bool:
  return any(path == safe or path.startswith(safe + ".") for safe in SAFE_TO_CHANGE)


def flat_config(config: ml_collections.ConfigDict | dict) -> dict[str, Any]:
  """`{"model.ff.kind": "sigma_moe", ...}`: every leaf of `config` as a checkpoint stores it."""
  return _flat(_as_saved(config))


def changed_fields(saved: dict | ml_collections.ConfigDict,
                   current: dict | ml_collections.ConfigDict) -> dict[str, tuple[Any, Any]]:
  """`{path: (saved value, current value)}` of every leaf that differs (missing: `<absent>`)."""
  old, new = flat_config(saved), flat_config(current)
  absent = "<absent>"
  return {path: (old.get(path, absent), new.get(path, absent))
          for path in sorted(old.keys() | new.keys()) if old.get(path, absent) !=
          new.get(path, absent)}


def check_resumable(saved: dict | ml_collections.ConfigDict,
                    current: dict | ml_collections.ConfigDict, *, workdir: str,
                    step: int) -> dict[str, tuple[Any, Any]]:
  """Returns the safe changes between the config checkpoint `step` of `workdir` was saved with
  and the current one; raises `ConfigError` naming every other changed field."""
  changes = changed_fields(saved, current)
  refused = {path: values for path, values in changes.items() if not is_safe(path)}
  if refused:
    listed = "\n".join(f"  {path}: {old!r} in the checkpoint, {new!r} now"
                       for path, (old, new) in refused.items())
    raise ConfigError(
        f"{workdir} holds a run (checkpoint of step {step}) trained with a different config; "
        f"these fields change the model, its data or its optimiser state, so it cannot resume "
        f"with them:\n{listed}\nRun with the checkpoint's values to resume, or start fresh "
        f"with another --workdir (or after deleting {workdir}/checkpoints). Fields that may "
        f"change on resume: {', '.join(SAFE_TO_CHANGE)}.")
  return {path: values for path, values in changes.items() if is_safe(path)}
