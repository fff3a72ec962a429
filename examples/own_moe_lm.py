"""Our sigma-MoE layer in a language model of your own: a small byte-level Transformer written
here in Flax NNX (not sparse_jax's TransformerLM), trained with optax on a text file of yours.

  python examples/own_moe_lm.py my_text.txt                  # 300 steps
  python examples/own_moe_lm.py my_text.txt --steps=100 --experts=16 --k=4

The one thing to copy: `y, aux = SigmaMoE(...)(x)` replaces a block's feed-forward layer;
`aux["reg_loss"]` (the router's entropy regulariser, already scaled by the layer's
`reg_coef`) is added to your loss, and `aux["expert_usage"]` counts the tokens each expert
took, here printed per layer. Needs only the installed package (`pip install sparse_jax`).
"""

import argparse
import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from sparse_jax.layers import SigmaMoE


class Block(nnx.Module):
  """Pre-LayerNorm block: Flax's causal attention, then our sigma-MoE as the feed-forward."""

  def __init__(self, d_model: int, n_heads: int, n_experts: int, expert_size: int, k: int,
               n_layers: int, *, rngs: nnx.Rngs):
    self.attention_norm = nnx.LayerNorm(d_model, rngs=rngs)
    self.attention = nnx.MultiHeadAttention(n_heads, d_model, decode=False, rngs=rngs)
    self.ff_norm = nnx.LayerNorm(d_model, rngs=rngs)
    self.moe = SigmaMoE(d_model, n_experts, expert_size, k, n_layers=n_layers, rngs=rngs)

  def __call__(self, x_btd: jax.Array, mask) -> tuple[jax.Array, dict]:
    x_btd = x_btd + self.attention(self.attention_norm(x_btd), mask=mask)
    y_btd, aux = self.moe(self.ff_norm(x_btd))
    return x_btd + y_btd, aux


class ByteLM(nnx.Module):
  """Bytes in, next-byte logits out; returns the blocks' summed `reg_loss` and their
  `expert_usage` stacked `[n_layers, n_experts]` beside the logits."""

  def __init__(self, args: argparse.Namespace, *, rngs: nnx.Rngs):
    self.embed = nnx.Embed(256, args.d_model, rngs=rngs)
    self.positions = nnx.Param(0.02 * jax.random.normal(rngs.params(),
                                                        (args.seq_len, args.d_model)))
    self.blocks = nnx.List([
        Block(args.d_model, args.heads, args.experts, args.expert_size, args.k, args.layers,
              rngs=rngs) for _ in range(args.layers)])
    self.norm = nnx.LayerNorm(args.d_model, rngs=rngs)
    self.head = nnx.Linear(args.d_model, 256, rngs=rngs)

  def __call__(self, tokens_bt: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    x_btd = self.embed(tokens_bt) + self.positions[:tokens_bt.shape[1]]
    mask = nnx.make_causal_mask(tokens_bt)
    reg_loss, usage = jnp.zeros(()), []
    for block in self.blocks:
      x_btd, aux = block(x_btd, mask)
      reg_loss += aux["reg_loss"]
      usage.append(aux["expert_usage"])
    return self.head(self.norm(x_btd)), reg_loss, jnp.stack(usage)


def loss_terms(model: ByteLM, batch_bt: jax.Array):
  """The training loss (cross-entropy plus the MoE regulariser) and, as auxiliaries, the
  cross-entropy alone, the regulariser and the expert usage."""
  logits, reg_loss, usage = model(batch_bt[:, :-1])
  ce = optax.softmax_cross_entropy_with_integer_labels(logits, batch_bt[:, 1:]).mean()
  return ce + reg_loss, (ce, reg_loss, usage)


@nnx.jit
def train_step(model: ByteLM, optimizer: nnx.Optimizer, batch_bt: jax.Array):
  grads, (ce, reg_loss, usage) = nnx.grad(loss_terms, has_aux=True)(model, batch_bt)
  optimizer.update(model, grads)
  return ce, reg_loss, usage


@nnx.jit
def eval_loss(model: ByteLM, batch_bt: jax.Array) -> jax.Array:
  return loss_terms(model, batch_bt)[1][0]


def batches(data: np.ndarray, batch: int, length: int, rng: np.random.Generator):
  """Random windows of `length + 1` bytes (inputs and their next bytes), forever."""
  while True:
    starts = rng.integers(0, len(data) - length - 1, size=batch)
    yield jnp.asarray(np.stack([data[s:s + length + 1] for s in starts]), jnp.int32)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("text_file", help="A text file (read as bytes): the last tenth validates.")
  parser.add_argument("--steps", type=int, default=300)
  parser.add_argument("--batch", type=int, default=16)
  parser.add_argument("--seq_len", type=int, default=64)
  parser.add_argument("--d_model", type=int, default=64)
  parser.add_argument("--heads", type=int, default=4)
  parser.add_argument("--layers", type=int, default=2)
  parser.add_argument("--experts", type=int, default=8)
  parser.add_argument("--expert_size", type=int, default=32)
  parser.add_argument("--k", type=int, default=2, help="Experts per token.")
  parser.add_argument("--lr", type=float, default=3e-3)
  parser.add_argument("--log_every", type=int, default=50)
  parser.add_argument("--seed", type=int, default=0)
  return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> dict:
  """Trains, prints the losses and expert usage, and returns them (the test reads them)."""
  args = parse_args(argv)
  with open(args.text_file, "rb") as f:
    data = np.frombuffer(f.read(), np.uint8)
  split = int(len(data) * 0.9)
  if min(split, len(data) - split) <= args.seq_len + 1:
    sys.exit(f"{args.text_file}: {len(data)} bytes is too short for --seq_len={args.seq_len}.")
  model = ByteLM(args, rngs=nnx.Rngs(args.seed))
  optimizer = nnx.Optimizer(model, optax.adamw(args.lr), wrt=nnx.Param)
  rng = np.random.default_rng(args.seed)
  train, validation = (batches(part, args.batch, args.seq_len, rng)
                       for part in (data[:split], data[split:]))
  first_val = float(eval_loss(model, next(validation)))
  for step in range(1, args.steps + 1):
    ce, reg_loss, usage = train_step(model, optimizer, next(train))
    if step % args.log_every == 0 or step == args.steps:
      print(f"step {step}: loss {float(ce):.3f} (bits/byte {float(ce) / np.log(2):.3f}), "
            f"MoE reg_loss {float(reg_loss):.2e}")
  val = float(eval_loss(model, next(validation)))
  print(f"validation loss: {first_val:.3f} before training, {val:.3f} after")
  share = np.asarray(usage) / np.asarray(usage).sum(axis=1, keepdims=True)
  for layer, row in enumerate(share):
    print(f"layer {layer} expert usage (share of the last batch's token slots): "
          + " ".join(f"{s:.2f}" for s in row))
  return {"train_loss": float(ce), "reg_loss": float(reg_loss), "usage": np.asarray(usage),
          "val_loss_before": first_val, "val_loss": val}


if __name__ == "__main__":
  main()
