"""Pretrained backbones for fine-tuning, from the `backbone` config section.

- `kind = "hf_roberta"`, `path`: a local Hugging Face RoBERTa directory (config.json,
  model.safetensors, tokenizer files), imported by `sparse_jax.models.hf_roberta`.
- `kind = "lm_checkpoint"`, `path` (a `train.py` workdir), `step` (None: latest): a byte-level
  `TransformerLM` trained by our own `train.py`, restored from its Orbax checkpoint.

`build_classifier` returns a `SequenceClassifier` whose backbone holds the pretrained weights,
with the plug-ins of `method` freshly initialised on top; `load_tokenizer` the tokenizer that
goes with the backbone.
"""

from typing import Literal

import ml_collections
from flax import nnx

from sparse_jax import schema, validation
from sparse_jax.data.task_tokenizers import ByteTokenizer, RobertaTokenizer
from sparse_jax.finetune import methods
from sparse_jax.layers.precision import COMPUTE_DTYPES
from sparse_jax.models import hf_roberta
from sparse_jax.models.classifier import SequenceClassifier
from sparse_jax.models.lm import TransformerLM
from sparse_jax.models.rngs import make_rngs
from sparse_jax.training.checkpointing import Checkpointer
from sparse_jax.training.optimizer import BatchedTrainConfig

BACKBONES = ("hf_roberta", "lm_checkpoint")


class BackboneConfig(schema.Schema):
  """The `backbone` section (module docstring); `step` None means the latest checkpoint."""

  kind: Literal[BACKBONES]  # A Hugging Face RoBERTa, or one of our LM runs.
  path: str  # The RoBERTa's directory, or the run's workdir.
  step: schema.PositiveInt | None = None  # lm_checkpoint: the checkpoint step.
  # The compute dtype while fine-tuning (`model.dtype`); None: the backbone's own.
  dtype: Literal[tuple(COMPUTE_DTYPES)] | None = None

  def check(self, path: str) -> None:
    validation.require(bool(self.path), f"{path}.path",
                       "a directory (HF RoBERTa or a train.py workdir)", self.path)


def parse(cfg) -> BackboneConfig:
  """The typed `backbone` section (a ConfigDict, dict or `BackboneConfig`)."""
  return BackboneConfig.parse(cfg, "backbone")


def _saved_step(checkpointer: Checkpointer, cfg: BackboneConfig) -> int:
  return checkpointer.resolve_step(cfg.step, how_to_make_one=(
      f"pretrain the backbone first, e.g. `python train.py --workdir={cfg.path}`"))


def backbone_model_config(cfg) -> ml_collections.ConfigDict:
  """The backbone's `model` section (no plug-ins), read without loading any weights."""
  cfg = parse(cfg)
  if cfg.kind == "hf_roberta":
    return hf_roberta.encoder_config(cfg.path)
  checkpointer = Checkpointer(cfg.path, read_only=True)
  try:
    return checkpointer.restore_config(_saved_step(checkpointer, cfg)).model
  finally:
    checkpointer.close()


def _lm_checkpoint(cfg: BackboneConfig):
  """The saved `model` section and a `TransformerLM` holding the checkpoint's parameters."""
  checkpointer = Checkpointer(cfg.path, read_only=True)
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


def load_tokenizer(cfg):
  """The tokenizer that goes with a `backbone` section's model."""
  cfg = parse(cfg)
  return RobertaTokenizer(cfg.path) if cfg.kind == "hf_roberta" else ByteTokenizer()


def load_backbone(cfg):
  """`(model config, pretrained backbone module)` of a `backbone` section."""
  cfg = parse(cfg)
  if cfg.kind == "hf_roberta":
    model_cfg = hf_roberta.encoder_config(cfg.path)
    return model_cfg, hf_roberta.load_encoder(cfg.path, model_cfg, rngs=make_rngs(0))
  return _lm_checkpoint(cfg)


def new_classifier(config, num_classes: int,
                   model_cfg: ml_collections.ConfigDict | None = None) -> SequenceClassifier:
  """A classifier of `config.backbone`'s architecture (`model_cfg`, default read from the
  backbone's config without its weights) with `config.method`'s plug-ins and a task head, all
  initialised from `config.seed`, the training streams in `train.rng_impl`."""
  model_cfg = backbone_model_config(config.backbone) if model_cfg is None else model_cfg
  dtype = parse(config.backbone).dtype
  if dtype is not None:
    model_cfg = ml_collections.ConfigDict({**dict(model_cfg), "dtype": dtype})
  method = methods.parse(config.method)
  rng_impl = BatchedTrainConfig.parse(config.train, "train").rng_impl
  return SequenceClassifier(methods.with_method(model_cfg, method), num_classes,
                            head_dropout=method.head_dropout,
                            rngs=make_rngs(config.seed, rng_impl))


def build_classifier(config, num_classes: int) -> SequenceClassifier:
  """`new_classifier` with the pretrained backbone's weights."""
  model_cfg, pretrained = load_backbone(config.backbone)
  classifier = new_classifier(config, num_classes, model_cfg)
  nnx.update(classifier.backbone, nnx.state(pretrained, nnx.Param))
  return classifier
