"""Small random Hugging Face RoBERTa directories (model and tokenizer) and what `transformers`
computes on them.

The default tests read the committed copies in `tests/data/hf_reference/` (made by
`make_reference.py` there with the live builders below), so they need neither torch nor
transformers; the live builders import them on call, for the tests that compare against a
freshly built model when the `hf` extra is installed.
"""

import os
import shutil

import numpy as np

PAD = 1
REFERENCE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data",
                             "hf_reference")
CORPUS = ["The quick brown fox jumps over the lazy dog.", "Sparse memories, frozen backbones!",
          "def f(x):\n    return x * 2  # bytes: \u00e9\u00e8", "A dog runs. An animal moves.",
          "It rains. The sun is out. Paris is in France."] * 20
# The tokenizer test's texts: single sentences, then pairs (first[i], second[i]).
FIRST = ["The lazy fox.", "frozen sparse dog jumps over the quick brown backbones " * 3, ""]
SECOND = ["Quick!", "def f(x): return x", "memories \u00e9"]
MAX_LEN = 16


def random_tokens(rng: np.random.Generator, batch: int = 3, t: int = 11) -> np.ndarray:
  """`[batch, t]` ids of a vocabulary of 61: `<s>` first, random ids, and padding at the end
  of every row but the first."""
  tokens = rng.integers(3, 61, size=(batch, t))
  tokens[:, 0] = 0
  for i, length in enumerate([t, 7, 4][:batch]):
    tokens[i, length:] = PAD
  return tokens


def reference_copy(name: str, dest) -> str:
  """A copy of the committed directory `name` (`base`, `head`: vocabulary 61;
  `roberta_320`: model and tokenizer; `tokenizer_json`: `tokenizer.json` only) at `dest`."""
  shutil.copytree(os.path.join(REFERENCE_DIR, name), dest, dirs_exist_ok=True)
  return str(dest)


def reference_outputs() -> dict[str, np.ndarray]:
  """What transformers computed on the committed directories (`make_reference.py`)."""
  with np.load(os.path.join(REFERENCE_DIR, "outputs.npz")) as outputs:
    return dict(outputs)


def save_random_roberta(path, *, head: bool = False, vocab_size: int = 61):
  """A 2-layer RoBERTa (d 32) with every tensor random (LayerNorms too), `save_pretrained`."""
  import torch  # pylint: disable=import-outside-toplevel  (the hf extra)
  import transformers  # pylint: disable=import-outside-toplevel

  config = transformers.RobertaConfig(
      vocab_size=vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
      intermediate_size=48, max_position_embeddings=40, type_vocab_size=1, pad_token_id=PAD,
      hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1)
  torch.manual_seed(0)
  cls = transformers.RobertaForSequenceClassification if head else transformers.RobertaModel
  model = cls(config)
  with torch.no_grad():
    for name, p in model.named_parameters():
      base = 1.0 if "LayerNorm.weight" in name else 0.0
      p.copy_(base + 0.2 * torch.randn_like(p))
  model.eval()
  model.save_pretrained(path)
  return model


def last_hidden_state(model, tokens: np.ndarray, *, head: bool) -> np.ndarray:
  """`[B, T, d]` hidden states of a `save_random_roberta` model (its encoder, for `head`)."""
  import torch  # pylint: disable=import-outside-toplevel

  with torch.no_grad():
    backbone = model.roberta if head else model
    return backbone(torch.tensor(tokens), attention_mask=torch.tensor(tokens != PAD)
                    ).last_hidden_state.numpy()


def save_tokenizer(path, vocab_size: int = 320) -> None:
  """RoBERTa-style byte-level BPE `vocab.json` + `merges.txt` trained on `CORPUS`."""
  import tokenizers  # pylint: disable=import-outside-toplevel

  bpe = tokenizers.ByteLevelBPETokenizer()
  bpe.train_from_iterator(CORPUS, vocab_size=vocab_size,
                          special_tokens=["<s>", "<pad>", "</s>", "<unk>", "<mask>"])
  os.makedirs(path, exist_ok=True)
  bpe.save_model(str(path))


def hf_encodings(path) -> dict[str, np.ndarray]:
  """The Hugging Face fast tokenizer of `path` on `FIRST` and on the pairs, padded to
  `MAX_LEN`: `{"single_ids", "single_mask", "pair_ids", "pair_mask"}`."""
  import transformers  # pylint: disable=import-outside-toplevel

  hf = transformers.RobertaTokenizerFast.from_pretrained(str(path))
  single = hf(FIRST, truncation=True, max_length=MAX_LEN, padding="max_length")
  pair = hf(FIRST, text_pair=SECOND, truncation=True, max_length=MAX_LEN,
            padding="max_length")
  return {"single_ids": np.array(single["input_ids"]),
          "single_mask": np.array(single["attention_mask"]),
          "pair_ids": np.array(pair["input_ids"]), "pair_mask": np.array(pair["attention_mask"])}


def save_roberta_directory(path) -> str:
  """A complete local RoBERTa directory: weights (vocabulary 320) and its tokenizer."""
  save_tokenizer(path)
  save_random_roberta(path, vocab_size=320)
  return str(path)
