"""Small random Hugging Face RoBERTa directories (model and tokenizer) saved by the tests."""

import tokenizers
import torch
import transformers

PAD = 1
CORPUS = ["The quick brown fox jumps over the lazy dog.", "Sparse memories, frozen backbones!",
          "def f(x):\n    return x * 2  # bytes: \u00e9\u00e8", "A dog runs. An animal moves.",
          "It rains. The sun is out. Paris is in France."] * 20


def save_random_roberta(path, *, head: bool = False, vocab_size: int = 61):
  """A 2-layer RoBERTa (d 32) with every tensor random (LayerNorms too), `save_pretrained`."""
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


def save_tokenizer(path, vocab_size: int = 320) -> None:
  """RoBERTa-style byte-level BPE `vocab.json` + `merges.txt` trained on `CORPUS`."""
  bpe = tokenizers.ByteLevelBPETokenizer()
  bpe.train_from_iterator(CORPUS, vocab_size=vocab_size,
                          special_tokens=["<s>", "<pad>", "</s>", "<unk>", "<mask>"])
  bpe.save_model(str(path))


def save_roberta_directory(path) -> str:
  """A complete local RoBERTa directory: weights (vocabulary 320) and its tokenizer."""
  save_tokenizer(path)
  save_random_roberta(path, vocab_size=320)
  return str(path)
