"""The RoBERTa importer against Hugging Face `transformers` (the `hf` extra) on small random
models saved in the test: hidden states, tokenization, plug-ins at their identity init."""

import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers
from flax import nnx
from hf_testing import PAD, save_random_roberta, save_tokenizer

from sparse_jax.data.task_tokenizers import RobertaTokenizer
from sparse_jax.models import hf_roberta

def _tokens(rng, batch=3, t=11):
  """`<s>` first, random ids, and padding at the end of every row but the first."""
  tokens = rng.integers(3, 61, size=(batch, t))
  tokens[:, 0] = 0
  for i, length in enumerate([t, 7, 4][:batch]):
    tokens[i, length:] = PAD
  return tokens


@pytest.mark.parametrize("head", [False, True])
def test_imported_encoder_reproduces_hugging_face_hidden_states(tmp_path, head):
  hf_model = save_random_roberta(tmp_path, head=head)
  tokens = _tokens(np.random.default_rng(1))
  with torch.no_grad():
    backbone = hf_model.roberta if head else hf_model
    expected = backbone(torch.tensor(tokens), attention_mask=torch.tensor(tokens != PAD)
                        ).last_hidden_state.numpy()
  encoder = hf_roberta.load_encoder(str(tmp_path), rngs=nnx.Rngs(0))
  encoder.eval()
  got, _ = encoder(jnp.asarray(tokens))
  valid = tokens != PAD
  # f32 on CPU: two layers of O(1) activations agree to ~1e-6; 2e-5 leaves room for summation
  # order differences.
  np.testing.assert_allclose(np.asarray(got)[valid], expected[valid], rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("adapters", ["houlsby", "pfeiffer"])
def test_near_identity_adapters_at_init_keep_the_backbone_outputs(tmp_path, adapters):
  save_random_roberta(tmp_path)
  cfg = hf_roberta.encoder_config(str(tmp_path))
  plain = hf_roberta.load_encoder(str(tmp_path), rngs=nnx.Rngs(0))
  cfg.adapters = {"kind": adapters, "bottleneck": 8, "init": "near_identity"}
  adapted = hf_roberta.load_encoder(str(tmp_path), cfg, rngs=nnx.Rngs(1))
  plain.eval(), adapted.eval()
  tokens = jnp.asarray(_tokens(np.random.default_rng(2)))
  n_adapters = sum(layer.attn_adapter is not None for layer in adapted.layers)
  assert n_adapters == (2 if adapters == "houlsby" else 0)
  np.testing.assert_array_equal(np.asarray(adapted(tokens)[0]), np.asarray(plain(tokens)[0]))


def test_missing_files_name_the_path(tmp_path):
  with pytest.raises(FileNotFoundError, match="config.json"):
    hf_roberta.encoder_config(str(tmp_path))
  with pytest.raises(FileNotFoundError, match="tokenizer.json"):
    RobertaTokenizer(str(tmp_path))


def test_weights_of_another_shape_are_refused(tmp_path):
  save_random_roberta(tmp_path)
  cfg = hf_roberta.encoder_config(str(tmp_path))
  cfg.ff.d_ff = 40
  with pytest.raises(ValueError, match="intermediate.dense.weight"):
    hf_roberta.load_encoder(str(tmp_path), cfg, rngs=nnx.Rngs(0))


@pytest.mark.parametrize("files", ["vocab_merges", "tokenizer_json"])
def test_tokenizer_matches_hugging_face(tmp_path, files):
  save_tokenizer(tmp_path)
  hf = transformers.RobertaTokenizerFast.from_pretrained(str(tmp_path))
  if files == "tokenizer_json":
    hf.save_pretrained(str(tmp_path))
    (tmp_path / "vocab.json").unlink()
  ours = RobertaTokenizer(str(tmp_path))
  first = ["The lazy fox.", "frozen sparse dog jumps over the quick brown backbones " * 3, ""]
  second = ["Quick!", "def f(x): return x", "memories \u00e9"]
  for texts, kwargs in [((first,), {}), ((first, second), {"text_pair": second})]:
    tokens, lengths = ours.encode(texts, max_len=16)
    expected = hf(first, truncation=True, max_length=16, padding="max_length", **kwargs)
    np.testing.assert_array_equal(tokens, np.array(expected["input_ids"]))
    np.testing.assert_array_equal(lengths, np.array(expected["attention_mask"]).sum(1))
