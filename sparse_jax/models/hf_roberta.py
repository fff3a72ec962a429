"""Import a local Hugging Face RoBERTa directory into an `Encoder` (no torch needed).

A directory saved by `transformers` (`RobertaModel` or any `RobertaFor...`) holds
`config.json` and `model.safetensors`; the weights are read with `safetensors.numpy`.
`encoder_config(path)` turns `config.json` into our `model` section; `load_weights(encoder,
path)` copies every backbone tensor into the encoder (PyTorch `Linear.weight [out, in]` is
transposed into `nnx.Linear.kernel [in, out]`) and fails, naming the tensor, on anything missing
or misshapen. The pooler and any task head in the file are ignored: tasks train their own head.
"""

import json
import os

import jax.numpy as jnp
import ml_collections
import numpy as np
from flax import nnx

from sparse_jax.models.encoder import Encoder

CONFIG_FILE, WEIGHTS_FILE = "config.json", "model.safetensors"
_PREFIXES = ("roberta.",)  # `RobertaFor...` checkpoints nest the backbone under this name.


def _require_file(path: str, name: str) -> str:
  file = os.path.join(path, name)
  if not os.path.isfile(file):
    raise FileNotFoundError(
        f"{file} not found: point backbone.path at a Hugging Face RoBERTa directory saved with "
        "`save_pretrained` (config.json, model.safetensors, and vocab.json + merges.txt or "
        "tokenizer.json), e.g. a local copy of https://huggingface.co/FacebookAI/roberta-base.")
  return file


def encoder_config(path: str) -> ml_collections.ConfigDict:
  """Our encoder `model` section (no plug-ins) from `path/config.json`."""
  with open(_require_file(path, CONFIG_FILE), encoding="utf-8") as f:
    hf = json.load(f)
  if hf.get("hidden_act", "gelu") != "gelu" or hf.get(
      "position_embedding_type", "absolute") != "absolute":
    raise ValueError(f"{path}: only RoBERTa with hidden_act='gelu' and absolute positions is "
                     f"supported; got {hf.get('hidden_act')!r}, "
                     f"{hf.get('position_embedding_type')!r}.")
  return ml_collections.ConfigDict({
      "kind": "encoder", "vocab_size": hf["vocab_size"], "d_model": hf["hidden_size"],
      "n_layers": hf["num_hidden_layers"], "n_heads": hf["num_attention_heads"],
      "max_positions": hf["max_position_embeddings"],
      "type_vocab_size": hf.get("type_vocab_size", 1), "pad_id": hf.get("pad_token_id", 1),
      "layer_norm_eps": float(hf.get("layer_norm_eps", 1e-5)),
      "dropout": float(hf.get("hidden_dropout_prob", 0.1)),
      "attn_dropout": float(hf.get("attention_probs_dropout_prob", 0.1)),
      "init_std": float(hf.get("initializer_range", 0.02)),
      "ff": {"kind": "dense", "d_ff": hf["intermediate_size"], "activation": "gelu",
             "dropout": 0.0},
      "memory": {"kind": "none"}, "adapters": {"kind": "none"},
  })


def _linear(hf: str, ours: str) -> dict[str, tuple[str, bool]]:
  return {f"{hf}.weight": (f"{ours}.kernel", True), f"{hf}.bias": (f"{ours}.bias", False)}


def _norm(hf: str, ours: str) -> dict[str, tuple[str, bool]]:
  return {f"{hf}.weight": (f"{ours}.scale", False), f"{hf}.bias": (f"{ours}.bias", False)}


def weight_map(n_layers: int) -> dict[str, tuple[str, bool]]:
  """HF tensor name -> (our parameter path, transpose?) for every backbone tensor."""
  names = {
      "embeddings.word_embeddings.weight": ("word_embeddings.embedding", False),
      "embeddings.position_embeddings.weight": ("position_embeddings.embedding", False),
      "embeddings.token_type_embeddings.weight": ("type_embeddings.embedding", False),
      **_norm("embeddings.LayerNorm", "embed_norm"),
  }
  for i in range(n_layers):
    hf, ours = f"encoder.layer.{i}", f"layers.{i}"
    for proj in ("query", "key", "value"):
      names.update(_linear(f"{hf}.attention.self.{proj}", f"{ours}.attn.{proj}"))
    names.update(_linear(f"{hf}.attention.output.dense", f"{ours}.attn.out"))
    names.update(_norm(f"{hf}.attention.output.LayerNorm", f"{ours}.attn_norm"))
    names[f"{hf}.intermediate.dense.weight"] = (f"{ours}.ff.w_up", True)
    names[f"{hf}.intermediate.dense.bias"] = (f"{ours}.ff.b_up", False)
    names[f"{hf}.output.dense.weight"] = (f"{ours}.ff.w_down", True)
    names[f"{hf}.output.dense.bias"] = (f"{ours}.ff.b_down", False)
    names.update(_norm(f"{hf}.output.LayerNorm", f"{ours}.ff_norm"))
  return names


def _variable(module: nnx.Module, path: str) -> nnx.Variable:
  node = module
  for part in path.split("."):
    node = node[int(part)] if part.isdigit() else getattr(node, part)
  return node


def load_weights(encoder: Encoder, path: str) -> None:
  """Copies the RoBERTa tensors of `path/model.safetensors` into `encoder` in place."""
  from safetensors.numpy import load_file  # Imported here: only importing needs it.

  tensors = load_file(_require_file(path, WEIGHTS_FILE))
  for prefix in _PREFIXES:
    tensors.update({name.removeprefix(prefix): value for name, value in tensors.items()
                    if name.startswith(prefix)})
  for hf_name, (ours, transpose) in weight_map(len(encoder.layers)).items():
    if hf_name not in tensors:
      raise ValueError(f"{path}/{WEIGHTS_FILE} has no tensor {hf_name!r}: not a RoBERTa "
                       "checkpoint of this configuration.")
    value = np.asarray(tensors[hf_name], np.float32)
    value = value.T if transpose else value
    variable = _variable(encoder, ours)
    current = variable[...]
    if value.shape != current.shape:
      raise ValueError(f"{hf_name} has shape {value.shape} but {ours} expects "
                       f"{current.shape}.")
    variable[...] = jnp.asarray(value, current.dtype)


def load_encoder(path: str, cfg: ml_collections.ConfigDict | None = None, *,
                 rngs: nnx.Rngs) -> Encoder:
  """An `Encoder` of `cfg` (default: `encoder_config(path)`) holding `path`'s weights."""
  encoder = Encoder(cfg if cfg is not None else encoder_config(path), rngs=rngs)
  load_weights(encoder, path)
  return encoder
