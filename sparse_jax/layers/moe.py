"""Mixture-of-experts feed-forward layers (sigma-MoE paper Sec. 3.3, 4 and 5).

All variants share the expert computation of Eq. 11,

    y = sum_{e in E_x} s[e] ReLU(x W1^e) W2^e,

run as one fused expert MLP (`pallas_kernels.expert_mlp`): the slots sorted by expert once,
the up projection, ReLU, expert-hidden dropout, the gate and the down projection on rows in
expert order. They differ only in their router (`sparse_jax.layers.routers`),
which picks the experts `E_x`, their weights `s[e]` and the regulariser.

Under a mesh with an `expert` axis the experts are split over it
(`sparse_jax.layers.expert_parallel`); the router still sees the whole batch.
"""

import math

import jax
import jax.numpy as jnp
from flax import nnx

from sparse_jax import parallel
from sparse_jax.layers import expert_parallel, initializers, sequence_parallel
from sparse_jax.layers.feed_forward import FeedForward
from sparse_jax.layers.routers import SigmaRouter
from sparse_jax.layers.routers.routing import Router, usage_counts

EXPERT_INITS = ("sigma", "standard", "switch", "fedus")


def expert_stds(init: str, d_model: int, n_experts: int, expert_size: int,
                n_layers: int) -> tuple[float, float]:
  """Init std of `W1^e` and `W2^e`.

  sigma (Sec. 5): as the dense baseline, `sqrt(2 / (fan_in * n_layers))` with the fan-in of
  the whole `d_ff = G * N_E` for W2. standard (the ablation): the fan-in of one expert (G).
  switch (the authors' Switch runs): the standard init scaled by sqrt(0.1),
  `sqrt(0.2 / (fan_in * n_layers))` with fan-ins d_model and G. fedus (Fedus et al., the
  paper's text): `sqrt(0.1 / fan_in)`, not depth-scaled.
  """
  if init == "fedus":
    return math.sqrt(0.1 / d_model), math.sqrt(0.1 / expert_size)
  down_fan_in = expert_size * n_experts if init == "sigma" else expert_size
  scale = math.sqrt(0.1) if init == "switch" else 1.0
  return (scale * initializers.depth_scaled_std(d_model, n_layers),
          scale * initializers.depth_scaled_std(down_fan_in, n_layers))


class MoE(FeedForward):
  """Experts `w_up [E, d_model, G]`, `w_down [E, G, d_model]` and a router; no biases.

  FF contract: `y, aux = moe(x)` with `x, y: [..., d_model]`; `aux["reg_loss"]` is the
  router's scaled regulariser and `aux["expert_usage"]` the `[E]` slot count per expert;
  `aux["token_share"]` is that count over the number of tokens (the fraction of tokens each
  expert processes, `training.routing_health`), plus the router's own `Routing.stats`, and
  `aux["router_logits"] [..., E]` where the router gives them (sigma).
  In training (`deterministic=False`, toggled by `train()`/`eval()`) the expert hidden units
  drop out with probability `expert_hidden_dropout`, drawn from a fork of the `dropout` stream.
  """

  RESIDUAL_OUTPUTS = ("w_down",)  # Its projection into the residual stream.

  def __init__(self, d_model: int, n_experts: int, expert_size: int, router: Router, *,
               n_layers: int, init: str = "sigma", expert_hidden_dropout: float = 0.0,
               impl: str = "auto", rngs: nnx.Rngs):
    if init not in EXPERT_INITS:
      raise ValueError(f"init must be one of {EXPERT_INITS}; got {init!r}.")
    self.d_model, self.n_experts, self.expert_size = d_model, n_experts, expert_size
    self.impl = impl
    std_up, std_down = expert_stds(init, d_model, n_experts, expert_size, n_layers)
    self.w_up = nnx.Param(jax.nn.initializers.normal(std_up)(rngs.params(),
                                                      (n_experts, d_model, expert_size)),
                          logical_axes=("experts", "embed", "mlp"))
    self.w_down = nnx.Param(jax.nn.initializers.normal(std_down)(rngs.params(),
                                                          (n_experts, expert_size, d_model)),
                            logical_axes=("experts", "mlp", "embed"))
    self.router = router
    self.expert_hidden_dropout = expert_hidden_dropout
    self.deterministic = False
    self.rngs = rngs["dropout"].fork()

  def __call__(self, x: jax.Array, sel_input: jax.Array | None = None
               ) -> tuple[jax.Array, dict[str, jax.Array]]:
    """`sel_input` (default `x`, same shape): what the router reads, where the experts read
    `x` (MoEUT: the router the LayerNorm'd residual, the experts the raw one). Under
    sequence parallelism (`layers.sequence_parallel`) `x [B, T, d]` arrives on sequence
    shards: the router and the experts read it whole, and the experts' output comes back
    reduce-scattered onto the shards."""
    seq_len = x.shape[1] if sequence_parallel.active() else None
    if seq_len is not None:
      x = parallel.whole_sequences(x)
      sel_input = None if sel_input is None else parallel.whole_sequences(sel_input)
    x_nd = self.token_rows(x, self.d_model)
    sel_nd = x_nd if sel_input is None else self.token_rows(sel_input, self.d_model)
    r = self.router(sel_nd, seq_len=x.shape[-2] if x.ndim > 1 else 1)
    dtype = x.dtype
    dropout = self.expert_hidden_dropout > 0 and not self.deterministic
    y_nd = expert_parallel.apply_experts(
        x_nd, r.sel_nk, r.gates_nk.astype(dtype), self.w_up[...].astype(dtype),
        self.w_down[...].astype(dtype), impl=self.impl, dropout_rate=self.expert_hidden_dropout,
        dropout_key=self.rngs() if dropout else None, seq_len=seq_len)
    usage_e = usage_counts(r.sel_nk, r.gates_nk, self.n_experts)
    aux = {"reg_loss": r.reg_loss.astype(jnp.float32), "expert_usage": usage_e,
           "token_share": usage_e.astype(jnp.float32) / x_nd.shape[0], **r.stats}
    if r.logits_ne is not None:
      aux["router_logits"] = r.logits_ne.reshape(*x.shape[:-1], self.n_experts)
    return y_nd.reshape(x.shape), aux

  def flops_per_token(self) -> int:
    """Multiply-adds: the router's (`Router.flops_per_token`) and k experts'."""
    return self.router.flops_per_token() + self.router.k * 2 * self.d_model * self.expert_size


class SigmaMoE(MoE):
  """sigma-MoE (Sec. 5): sigmoid router with expert dropout and the entropy regulariser,
  the sigma init (or the "standard" ablation).

  Example:
    A drop-in feed-forward layer: add `aux["reg_loss"]` to your loss;
    `aux["expert_usage"]` counts each expert's token slots (k per token):

    >>> from sparse_jax.layers import SigmaMoE
    >>> moe = SigmaMoE(d_model=16, n_experts=4, expert_size=8, k=2, n_layers=2,
    ...                rngs=nnx.Rngs(0))
    >>> y, aux = moe(jnp.ones((2, 5, 16)))
    >>> y.shape, aux["expert_usage"].shape, int(aux["expert_usage"].sum())
    ((2, 5, 16), (4,), 20)
    >>> aux["reg_loss"].shape
    ()
  """

  def __init__(self, d_model: int, n_experts: int, expert_size: int, k: int, *, n_layers: int,
               expert_dropout: float = 0.0, reg_coef: float = 0.001, init: str = "sigma",
               expert_hidden_dropout: float = 0.0, impl: str = "auto", rngs: nnx.Rngs):
    router = SigmaRouter(d_model, n_experts, k, n_layers=n_layers,
                         expert_dropout=expert_dropout, reg_coef=reg_coef, rngs=rngs)
    super().__init__(d_model, n_experts, expert_size, router, n_layers=n_layers, init=init,
                     expert_hidden_dropout=expert_hidden_dropout, impl=impl, rngs=rngs)
