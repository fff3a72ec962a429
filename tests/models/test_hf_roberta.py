"""The RoBERTa importer against Hugging Face `transformers` on small random models: hidden
states, tokenization, plug-ins at their identity init.

The reference tests read what transformers computed once on the committed models
(`tests/data/hf_reference/`, `make_reference.py`), so they run without torch; the live tests
build a fresh random model with transformers and run only with the `hf` extra installed.
"""

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from hf_testing import (FIRST, MAX_LEN, PAD, SECOND, hf_encodings, last_hidden_state,
                        random_tokens, reference_copy, reference_outputs, save_random_roberta,
                        save_tokenizer)

from sparse_jax.data.task_tokenizers import RobertaTokenizer
from sparse_jax.models import hf_roberta


def _needs_hf():
  pytest.importorskip("torch", reason="the live comparison needs the hf extra")
  pytest.importorskip("transformers", reason="the live comparison needs the hf extra")


def assert_encoder_reproduces(path, tokens, expected):
  encoder = hf_roberta.load_encoder(str(path), rngs=nnx.Rngs(0))
  encoder.eval()
  got, _ = encoder(jnp.asarray(tokens))
  valid = tokens != PAD
  # f32 on CPU: two layers of O(1) activations agree to ~1e-6; 2e-5 leaves room for summation
  # order differences.
  np.testing.assert_allclose(np.asarray(got)[valid], expected[valid], rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("head", [False, True])
def test_imported_encoder_reproduces_the_reference_hidden_states(tmp_path, head):
  name = "head" if head else "base"
  outputs = reference_outputs()
  assert_encoder_reproduces(reference_copy(name, tmp_path), outputs["tokens"],
                            outputs[f"hidden_{name}"])


@pytest.mark.parametrize("head", [False, True])
def test_imported_encoder_reproduces_a_fresh_hugging_face_model(tmp_path, head):
  _needs_hf()
  hf_model = save_random_roberta(tmp_path, head=head)
  tokens = random_tokens(np.random.default_rng(1))
  assert_encoder_reproduces(tmp_path, tokens, last_hidden_state(hf_model, tokens, head=head))


@pytest.mark.parametrize("adapters", ["houlsby", "pfeiffer"])
def test_near_identity_adapters_at_init_keep_the_backbone_outputs(tmp_path, adapters):
  path = reference_copy("base", tmp_path)
  cfg = hf_roberta.encoder_config(path)
  plain = hf_roberta.load_encoder(path, rngs=nnx.Rngs(0))
  cfg.adapters = {"kind": adapters, "bottleneck": 8, "init": "near_identity"}
  adapted = hf_roberta.load_encoder(path, cfg, rngs=nnx.Rngs(1))
  plain.eval(), adapted.eval()
  tokens = jnp.asarray(random_tokens(np.random.default_rng(2)))
  n_adapters = sum(layer.attn_adapter is not None for layer in adapted.layers)
  assert n_adapters == (2 if adapters == "houlsby" else 0)
  np.testing.assert_array_equal(np.asarray(adapted(tokens)[0]), np.asarray(plain(tokens)[0]))


def test_missing_files_name_the_path(tmp_path):
  with pytest.raises(FileNotFoundError, match="config.json"):
    hf_roberta.encoder_config(str(tmp_path))
  with pytest.raises(FileNotFoundError, match="tokenizer.json"):
    RobertaTokenizer(str(tmp_path))


def test_weights_of_another_shape_are_refused(tmp_path):
  path = reference_copy("base", tmp_path)
  cfg = hf_roberta.encoder_config(path)
  cfg.ff.d_ff = 40
  with pytest.raises(ValueError, match="intermediate.dense.weight"):
    hf_roberta.load_encoder(path, cfg, rngs=nnx.Rngs(0))


def assert_tokenizer_matches(path, expected):
  ours = RobertaTokenizer(str(path))
  for kind, texts in [("single", (FIRST,)), ("pair", (FIRST, SECOND))]:
    tokens, lengths = ours.encode(texts, max_len=MAX_LEN)
    np.testing.assert_array_equal(tokens, expected[f"{kind}_ids"])
    np.testing.assert_array_equal(lengths, expected[f"{kind}_mask"].sum(1))


@pytest.mark.parametrize("files", ["roberta_320", "tokenizer_json"])
def test_tokenizer_matches_the_reference_ids(tmp_path, files):
  """`roberta_320`: vocab.json + merges.txt; `tokenizer_json`: tokenizer.json only."""
  assert_tokenizer_matches(reference_copy(files, tmp_path), reference_outputs())


@pytest.mark.parametrize("files", ["vocab_merges", "tokenizer_json"])
def test_tokenizer_matches_a_fresh_hugging_face_tokenizer(tmp_path, files):
  _needs_hf()
  import transformers  # pylint: disable=import-outside-toplevel

  save_tokenizer(tmp_path)
  if files == "tokenizer_json":
    transformers.RobertaTokenizerFast.from_pretrained(str(tmp_path)).save_pretrained(
        str(tmp_path))
    (tmp_path / "vocab.json").unlink()
  assert_tokenizer_matches(tmp_path, hf_encodings(tmp_path))
