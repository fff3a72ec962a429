"""Pretrained backbones for fine-tuning, from the `backbone` config section.

- `kind = "hf_roberta"`, `path`: a local Hugging Face RoBERTa directory (config.json,
  model.safetensors, tokenizer files), imported by `sparse_jax.models.hf_roberta`.
- `kind = "lm_checkpoint"`, `path` (a `train.py` workdir), `step` (None: latest): a byte-level
  `TransformerLM` trained by our own `train.py`, restored from its Orbax checkpoint.

`build_classifier` returns a `SequenceClassifier` whose backbone holds the pretrained weights,
with the plug-ins of `method` freshly initialised on top; `load_tokenizer` the tokenizer that
goes with the backbone.
"""

import ml_collections
from flax import nnx

from sparse_jax import validation
from sparse_jax.data.task_tokenizers import ByteTokenizer, RobertaTokenizer
from sparse_jax.models import hf_roberta
from sparse_jax.models.classifier import SequenceClassifier
from sparse_jax.models.lm import TransformerLM
from sparse_jax.training.checkpointing import Checkpointer
from sparse_jax.finetune.methods import with_method
from sparse_jax.training.steps import make_rngs

BACKBONES = ("hf_roberta", "lm_checkpoint")


def validate_backbone_config(cfg: ml_collections.ConfigDict) -> None:
  validation.require_choice(cfg.get("kind"), "backbone.kind", BACKBONES)
  validation.require(isinstance(cfg.get("path"), str) and cfg.path, "backbone.path",
                     "a directory (HF RoBERTa or a train.py workdir)", cfg.get("path"))
  step = cfg.get("step")
  validation.require(step is None or (isinstance(step, int) and step > 0), "backbone.step",
                     "None (latest) or a checkpoint step", step)


def _saved_step(checkpointer: Checkpointer, cfg: ml_collections.ConfigDict) -> int:
  steps = checkpointer.all_steps()
  step = cfg.get("step") or (max(steps) if steps else None)
  if step not in steps:
    raise FileNotFoundError(
        f"no checkpoint{'' if step is None else f' of step {step}'} in {cfg.path}/checkpoints"
        f": pretrain the backbone first, e.g. `python train.py --workdir={cfg.path}`.")
  return step


def backbone_model_config(cfg: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """The backbone's `model` section (no plug-ins), read without loading any weights."""
  validate_backbone_config(cfg)
  if cfg.kind == "hf_roberta":
    return hf_roberta.encoder_config(cfg.path)
  checkpointer = Checkpointer(cfg.path)
  try:
    return checkpointer.restore_config(_saved_step(checkpointer, cfg)).model
  finally:
    checkpointer.close()


def _lm_checkpoint(cfg: ml_collections.ConfigDict):
  """The saved `model` section and a `TransformerLM` holding the checkpoint's parameters."""
  checkpointer = Checkpointer(cfg.path)
  try:
    step = _saved_step(checkpointer, cfg)
    model_cfg = checkpointer.restore_config(step).model
    lm = TransformerLM(model_cfg, rngs=make_rngs(0))
    checkpointer.restore_params(step, lm)
  finally:
    checkpointer.close()
  validation.require(model_cfg.vocab_size == ByteTokenizer.vocab_size, "backbone.path",
                     "a byte-level LM (vocab_size 256) for the byte tokenizer",
                     f"{cfg.path} (vocab_size {model_cfg.vocab_size})")
  return model_cfg, lm


def load_tokenizer(cfg: ml_collections.ConfigDict):
  """The tokenizer that goes with a `backbone` section's model."""
  validate_backbone_config(cfg)
  return RobertaTokenizer(cfg.path) if cfg.kind == "hf_roberta" else ByteTokenizer()


def load_backbone(cfg: ml_collections.ConfigDict):
  """`(model config, pretrained backbone module)` of a `backbone` section."""
  validate_backbone_config(cfg)
  if cfg.kind == "hf_roberta":
    model_cfg = hf_roberta.encoder_config(cfg.path)
    return model_cfg, hf_roberta.load_encoder(cfg.path, model_cfg, rngs=make_rngs(0))
  return _lm_checkpoint(cfg)


def build_classifier(config: ml_collections.ConfigDict, num_classes: int) -> SequenceClassifier:
  """The pretrained backbone with `config.method`'s plug-ins (freshly initialised) and a
  task head."""
  model_cfg, pretrained = load_backbone(config.backbone)
  classifier = SequenceClassifier(with_method(model_cfg, config.method), num_classes,
                                  head_dropout=config.method.get("head_dropout", 0.1),
                                  rngs=make_rngs(config.seed))
  nnx.update(classifier.backbone, nnx.state(pretrained, nnx.Param))
  return classifier
