"""Model FLOPs of a training step (`models.accounting`) against the dots XLA compiles.

The reference is independent of our count: every `dot` in the HLO of the compiled training
step (the real `make_train_step`, optimiser included), `2 * output size * contracted size`
FLOPs each. Elementwise work (norms, softmax, Adam) is no dot, so the two agree exactly where
a model computes only useful products; where it computes more, the test adds that explicitly
(attention scores the causal mask discards, the input gradient of the XL memory's
stop-gradient rows, SPARTAN's one-hot scatter of its gates). The tolerance, 1e-9 relative,
only absorbs float rounding of the integer counts.
"""

import math
import re

import jax
import jax.numpy as jnp
import ml_collections
import optax
import pytest
from flax import nnx

from sparse_jax.finetune import methods
from sparse_jax.models import accounting
from sparse_jax.models.accounting import Matmuls, step_flops
from sparse_jax.models.classifier import SequenceClassifier
from sparse_jax.models.lm import TransformerLM
from sparse_jax.models.terraformer import Terraformer
from sparse_jax.models.xl_memory import XLMemory
from sparse_jax.training.steps import make_train_step

B, T, D, L = 4, 32, 64, 2  # batch rows, tokens per row, d_model, layers
HD = D  # heads x head_dim

_DEFINITION = re.compile(r"%([\w.\-]+) = \w+\[([\d,]*)\]")
_DOT = re.compile(r"= \w+\[([\d,]*)\]\S* dot\(%([\w.\-]+), %[\w.\-]+\)"
                  r".*?lhs_contracting_dims=\{([\d,]*)\}")


def dot_flops(hlo: str) -> int:
  """`2 * output size * contracted size` summed over the `dot`s of an HLO module's text."""
  shapes = {name: [int(n) for n in dims.split(",") if n]
            for name, dims in _DEFINITION.findall(hlo)}
  total = 0
  for out, lhs, contracting in _DOT.findall(hlo):
    out_size = math.prod(int(n) for n in out.split(",") if n)
    total += 2 * out_size * math.prod(shapes[lhs][int(i)] for i in contracting.split(",") if i)
  return total


def xla_step_flops(model, loss_fn, batch, carry=None, wrt=nnx.Param) -> int:
  """The dot FLOPs of the compiled training step of `model` (Adam on the `wrt` parameters)."""
  optimizer = nnx.Optimizer(model, optax.adam(1e-3), wrt=wrt)
  graphdef, state = nnx.split((model, optimizer))
  step = make_train_step(graphdef, loss_fn, seed=0, wrt=wrt)
  traced = step.trace(nnx.to_pure_dict(state), carry, batch, 0)
  return dot_flops(traced.lower().compile().as_text())


def masked_pairs(t: int, keys: int) -> int:
  """(query, key) pairs causal attention computes but masks: `t * keys - t (t + 1) / 2`."""
  return t * keys - t * (t + 1) // 2


def lm_config(**overrides) -> dict:
  return {"vocab_size": 128, "d_model": D, "n_layers": L, "n_heads": 4, "mem_len": 0,
          "dropout": 0.0, "attention": "causal", "ff": {"kind": "dense", "d_ff": 128},
          **overrides}


def lm_loss(model, batch, memory):
  logits, new_memory, aux = model(batch["inputs"], memory)
  ce = optax.softmax_cross_entropy_with_integer_labels(logits, batch["targets"]).mean()
  return ce + aux["reg_loss"], ({}, new_memory)


def token_batch(b: int = B, t: int = T) -> dict[str, jax.Array]:
  tokens = jax.random.randint(jax.random.key(0), (b, t), 2, 100)
  return {"inputs": tokens, "targets": tokens}


def test_step_flops_convention():
  """Forward once; backward: the input gradient past the lowest trained part, the weight
  gradient of trained parts, both operands' gradients of activation products."""
  parts = [Matmuls(10, False), Matmuls(5, True), Matmuls(7, False, activations=True),
           Matmuls(3, False), Matmuls(4, True, input_grad=False)]
  assert step_flops(parts) == 2 * (10 * 1 + 5 * 2 + 7 * 3 + 3 * 2 + 4 * 2)
  assert step_flops([Matmuls(5, True), Matmuls(3, True)]) == 2 * (5 * 2 + 3 * 3)


def test_dense_causal_lm_matches_xla():
  lm = TransformerLM(lm_config(), rngs=nnx.Rngs(0))
  masked = L * 2 * B * HD * masked_pairs(T, T)  # Scores and values, forward multiply-adds.
  assert xla_step_flops(lm, lm_loss, token_batch()) == pytest.approx(
      accounting.lm_step_flops(lm, B, T) + 2 * 3 * masked, rel=1e-9)
  # The usual 6 N per token plus attention: 6 (4 d^2 + 2 d d_ff + d V) + 6 * 2 d (T + 1) / 2.
  per_token = 6 * (L * (4 * D * D + 2 * D * 128 + D * (T + 1)) + D * 128)
  assert accounting.lm_step_flops(lm, B, T) == B * T * per_token


def test_transformer_xl_with_a_full_memory_matches_xla():
  """XL attention: the position scores are a third product per (query, key); memory rows take
  the K and V projections forward and their weight gradients, but no input gradient."""
  m = 16
  lm = TransformerLM(lm_config(attention="xl", mem_len=m), rngs=nnx.Rngs(0))
  memory = XLMemory(jax.random.normal(jax.random.key(1), (L, B, m, D)), jnp.array(m, jnp.int32))
  masked = L * 3 * B * HD * masked_pairs(T, T)  # Every memory row is visible.
  memory_input_grads = L * 2 * B * m * D * HD
  assert xla_step_flops(lm, lm_loss, token_batch(), memory) == pytest.approx(
      accounting.lm_step_flops(lm, B, T) + 2 * (3 * masked + memory_input_grads), rel=1e-9)


def test_sigma_moe_counts_the_selected_experts_only():
  """The forward of the gather oracle (which multiplies only the k chosen experts) matches,
  plus its gate-weighted sum of the k expert outputs; the step counts 3x the k experts'
  `2 d G` multiply-adds per token (the oracle's weight gradient is an outer product XLA runs
  as a multiply, so the backward cannot be read from its dots)."""
  def moe(k):
    return {"kind": "sigma_moe", "n_experts": 8, "expert_size": 32, "k": k, "reg_coef": 1e-3,
            "expert_dropout": 0.0, "init": "sigma", "expert_hidden_dropout": 0.0,
            "impl": "gather"}

  lm = TransformerLM(lm_config(ff=moe(2)), rngs=nnx.Rngs(0))
  graphdef, state = nnx.split(lm)

  def forward(state, tokens):
    logits, _, aux = nnx.merge(graphdef, state)(tokens)
    return logits.sum() + aux["reg_loss"]

  xla = dot_flops(jax.jit(forward).lower(state, token_batch()["inputs"]).compile().as_text())
  gates = L * B * T * 2 * D
  masked = L * 2 * B * HD * masked_pairs(T, T)
  assert xla == pytest.approx(accounting.lm_step_flops(lm, B, T, wrt=False)
                              + 2 * (gates + masked), rel=1e-9)
  lm_k4 = nnx.eval_shape(lambda: TransformerLM(lm_config(ff=moe(4)), rngs=nnx.Rngs(0)))
  two_more_experts = L * B * T * 2 * (2 * D * 32)
  assert (accounting.lm_step_flops(lm_k4, B, T) - accounting.lm_step_flops(lm, B, T)
          == 6 * two_more_experts)


@pytest.mark.parametrize("attention, m", [("switchhead", 0), ("switchhead_xl", 16)])
def test_switchhead_counts_the_selected_experts_only(attention, m):
  """SwitchHead's forward on the gather oracle (only the K chosen V and O experts multiply):
  ours plus the scores the causal mask discards (XL: 3 products per pair, every memory row
  visible) plus the oracle's gate-weighted sums, `H K Dh` per key row (V, memory rows too)
  and `H K d` per query (O)."""
  h, e, k = 4, 4, 2
  lm = TransformerLM(lm_config(attention=attention, mem_len=m, attention_experts=e,
                               attention_k=k, attention_impl="gather"), rngs=nnx.Rngs(0))
  graphdef, state = nnx.split(lm)
  memory = XLMemory(jax.random.normal(jax.random.key(1), (L, B, m, D)), jnp.array(m, jnp.int32))

  def forward(state, tokens, memory):
    logits, _, aux = nnx.merge(graphdef, state)(tokens, memory)
    return logits.sum() + aux["reg_loss"]

  xla = dot_flops(jax.jit(forward).lower(state, token_batch()["inputs"], memory)
                  .compile().as_text())
  products = 3 if m else 2
  masked = L * products * B * HD * masked_pairs(T, T)
  gates = L * B * ((m + T) * h * k * (HD // h) + T * h * k * D)
  assert xla == pytest.approx(accounting.lm_step_flops(lm, B, T, wrt=False)
                              + 2 * (masked + gates), rel=1e-9)


ENCODER = {"kind": "encoder", "vocab_size": 128, "d_model": D, "n_layers": L, "n_heads": 4,
           "max_positions": T + 2, "type_vocab_size": 1, "pad_id": 1, "layer_norm_eps": 1e-5,
           "dropout": 0.0, "attn_dropout": 0.0, "init_std": 0.02,
           "ff": {"kind": "dense", "d_ff": 128, "activation": "gelu", "dropout": 0.0}}


@pytest.mark.parametrize("method", ["full", "head", "houlsby", "spartan"])
def test_classifier_over_a_frozen_backbone_matches_xla(method):
  """full: 3x everywhere; head: the backbone forward only; houlsby: frozen layers 2x above
  the first adapter, whose down projection takes no input gradient; spartan: the backbone's
  LayerNorms train, so every frozen matmul is 2x (its dense read also scatters the K chosen
  parents' gates into `[N, N_p]` with a one-hot matmul, forward and backward)."""
  parsed = methods.parse({"kind": method, "spartan": {"n_parents": 8, "top_k": 4}})
  model = SequenceClassifier(methods.with_method(ml_collections.ConfigDict(ENCODER), parsed), 3,
                             head_dropout=0.0, rngs=nnx.Rngs(0))
  wrt = methods.trainable_filter(parsed)
  batch = {"tokens": token_batch()["inputs"], "lengths": jnp.full((B,), T),
           "labels": jnp.arange(B) % 3}

  def loss(model, batch, carry):
    logits, aux = model(batch["tokens"], batch["lengths"])
    ce = optax.softmax_cross_entropy_with_integer_labels(logits, batch["labels"]).mean()
    return ce + aux["reg_loss"], ({}, carry)

  scatter = L * B * T * 4 * 8 * 2 if method == "spartan" else 0
  assert xla_step_flops(model, loss, batch, wrt=wrt) == pytest.approx(
      accounting.classifier_step_flops(model, B, T, wrt=wrt) + 2 * scatter, rel=1e-9)


def test_terraformer_with_lsh_encoder_and_sru_matches_xla():
  """Encoder: LSH attention over `N W` keys per query plus its hashing (forward only: the
  hash is discrete); decoder: dense causal attention over the concatenation `S + T`.
  Sinusoidal positions: the accounting leaves out the fixed-base encoding's elementwise
  products (`n_bases * d_model` per token), which XLA counts."""
  cfg = {"vocab_size": 64, "d_model": D, "n_heads": 4, "n_encoder_layers": 1,
         "positions": "sinusoid",
         "n_decoder_layers": 1, "dropout": 0.0, "ff": {"kind": "dense", "d_ff": 128},
         "sru_units": 16, "encoder_attention": "lsh", "decoder_attention": "dense",
         "reversible": False, "lsh": {"n_hashes": 2, "n_buckets": 4, "chunk_len": 8}}
  model = Terraformer(cfg, rngs=nnx.Rngs(0))
  s, t = 16, 8
  batch = {"inputs": token_batch(B, s)["inputs"], "targets": token_batch(B, t)["inputs"]}

  def loss(model, batch, carry):
    logits, aux = model(batch["inputs"], batch["targets"])
    ce = optax.softmax_cross_entropy_with_integer_labels(logits, batch["targets"]).mean()
    return ce + aux["reg_loss"], ({}, carry)

  masked = 2 * 2 * B * HD * masked_pairs(s + t, s + t)  # Two attention halves per block.
  assert xla_step_flops(model, loss, batch) == pytest.approx(
      accounting.terraformer_step_flops(model, B, s, t) + 2 * 3 * masked, rel=1e-9)
