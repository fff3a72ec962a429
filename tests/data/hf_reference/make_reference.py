"""Rebuilds the committed Hugging Face reference data in this directory (needs the `hf` extra):

  python tests/data/hf_reference/make_reference.py

Writes small random RoBERTas with `transformers` (`base/` and `head/`, vocabulary 61;
`roberta_320/` with its byte-level BPE tokenizer; `tokenizer_json/`, the same tokenizer as
`tokenizer.json` only) and `outputs.npz`: the hidden states transformers computes for fixed
tokens, and its tokenizer's ids and masks for the tokenizer test's texts. Deterministic
(fixed seeds), so a rebuild reproduces the files.
"""

import os
import shutil
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))  # tests/, for hf_testing

import hf_testing  # noqa: E402  pylint: disable=wrong-import-position


def main() -> None:
  import transformers  # pylint: disable=import-outside-toplevel

  for name in ("base", "head", "roberta_320", "tokenizer_json"):
    shutil.rmtree(os.path.join(HERE, name), ignore_errors=True)
  tokens = hf_testing.random_tokens(np.random.default_rng(1))
  outputs = {"tokens": tokens}
  for head in (False, True):
    name = "head" if head else "base"
    model = hf_testing.save_random_roberta(os.path.join(HERE, name), head=head)
    outputs[f"hidden_{name}"] = hf_testing.last_hidden_state(model, tokens, head=head)
  roberta = hf_testing.save_roberta_directory(os.path.join(HERE, "roberta_320"))
  outputs.update(hf_testing.hf_encodings(roberta))
  json_dir = os.path.join(HERE, "tokenizer_json")
  transformers.RobertaTokenizerFast.from_pretrained(roberta).save_pretrained(json_dir)
  for name in os.listdir(json_dir):
    if name != "tokenizer.json":
      os.remove(os.path.join(json_dir, name))
  np.savez_compressed(os.path.join(HERE, "outputs.npz"), **outputs)


if __name__ == "__main__":
  main()
