"""S-BASE routing (sigma-MoE paper Sec. 4): Sinkhorn-balanced assignment of sigmoid scores."""

import math

import jax
import jax.numpy as jnp
from flax import nnx

from sparse_jax.layers.routers import routing

SINKHORNS = ("authors", "standard")
BALANCE_OVER = ("sequence", "batch")


def sinkhorn(logits_ne: jax.Array, n_iters: int) -> jax.Array:
  """`[N, E]` log of a matrix with rows summing to 1/N and columns to 1/E (approximately).

  Alternating row then column normalisation of `exp(logits)` (Sinkhorn-Knopp) in log space:
  the entropic relaxation of BASE's balanced linear assignment (Eq. 19).
  """
  n, e = logits_ne.shape[-2:]
  log_p = logits_ne.astype(jnp.float32)
  for _ in range(n_iters):
    log_p = log_p - jax.nn.logsumexp(log_p, axis=-1, keepdims=True) - math.log(n)
    log_p = log_p - jax.nn.logsumexp(log_p, axis=-2, keepdims=True) - math.log(e)
  return log_p


def authors_sinkhorn(logits_ne: jax.Array, n_iters: int) -> jax.Array:
  """`[..., N, E]` the log of the balanced matrix exactly as the sigma-MoE authors compute it.

  Per-token potentials b and per-expert potentials a, both from 0, updated rows then columns:
  `b = log N - lse_e(x - a)`, `a = log E - lse_n(x - b)`; the result is `x + a + b`. Their
  signs differ from textbook Sinkhorn (the matrix drifts in scale rather than converging),
  but the per-token ranking it produces still pushes tokens away from popular experts.
  Ranking by this log equals ranking their `exp(x + a + b)` wherever that does not underflow.
  """
  n, e = logits_ne.shape[-2:]
  x = logits_ne.astype(jnp.float32)
  a_e = jnp.zeros(x.shape[:-2] + (1, e), jnp.float32)
  b_n = jnp.zeros(x.shape[:-1] + (1,), jnp.float32)
  for _ in range(n_iters):
    b_n = math.log(n) - jax.nn.logsumexp(x - a_e, axis=-1, keepdims=True)
    a_e = math.log(e) - jax.nn.logsumexp(x - b_n, axis=-2, keepdims=True)
  return x + a_e + b_n


def rerouted_fraction(scores_ne: jax.Array, gates_nk: jax.Array, k: int) -> jax.Array:
  """The fraction of slots whose expert is not among the token's own top-k by score: what the
  balanced assignment (and expert dropout) moved. `gates_nk` are the slots' scores, so a slot
  is re-routed when its score is below the token's k-th largest (ties count as kept)."""
  kth_n = jax.lax.top_k(scores_ne, k)[0][:, -1]
  return jnp.mean((gates_nk < kth_n[:, None]).astype(jnp.float32))


class SBaseRouter(routing.Router):
  """Scores `s = sigmoid(x W3^T)`. Training: experts are the top-k of the Sinkhorn-balanced
  assignment; evaluation: the plain top-k of s. Gates are always s. The regulariser is
  sigma-MoE's Eq. 20, as the paper uses for S-BASE.

  The authors' runs (the defaults): the balance is computed per sequence (`seq_len` tokens
  in order) with their iteration (`authors_sinkhorn`), and expert dropout (`fill` -inf on
  the balanced matrix before the top-k). `balance_over="batch"` with `sinkhorn="standard"`
  is the paper text's Sinkhorn over the whole batch.
  """

  def __init__(self, d_model: int, n_experts: int, k: int, *, n_layers: int,
               sinkhorn_iters: int = 3, reg_coef: float = 0.0, expert_dropout: float = 0.0,
               balance_over: str = "sequence", sinkhorn_form: str = "authors",
               rngs: nnx.Rngs):
    if balance_over not in BALANCE_OVER or sinkhorn_form not in SINKHORNS:
      raise ValueError(f"balance_over must be one of {BALANCE_OVER} and sinkhorn_form one "
                       f"of {SINKHORNS}; got {balance_over!r}, {sinkhorn_form!r}.")
    super().__init__(d_model, n_experts, k, n_layers=n_layers, rngs=rngs)
    self.sinkhorn_iters, self.reg_coef = sinkhorn_iters, reg_coef
    self.expert_dropout, self.balance_over = expert_dropout, balance_over
    self.sinkhorn = authors_sinkhorn if sinkhorn_form == "authors" else sinkhorn
    self.deterministic = False
    self.rngs = rngs["routing"].fork()

  def _balanced(self, logits_ne: jax.Array, seq_len: int | None) -> jax.Array:
    """`[N, E]` the log balanced assignment, per sequence or over the batch."""
    n, e = logits_ne.shape
    seq_len = n if self.balance_over == "batch" or seq_len is None else seq_len
    if n % seq_len:
      raise ValueError(f"S-BASE balances per sequence: {n} tokens are not whole sequences "
                       f"of {seq_len}.")
    per_seq_bte = jax.lax.stop_gradient(logits_ne).reshape(n // seq_len, seq_len, e)
    return self.sinkhorn(per_seq_bte, self.sinkhorn_iters).reshape(n, e)

  def __call__(self, x_nd: jax.Array, *, seq_len: int | None = None) -> routing.Routing:
    logits_ne = routing.selector_logits(x_nd, self.w_sel[...])
    scores_ne = jax.nn.sigmoid(logits_ne)
    if self.deterministic:
      _, sel_nk = jax.lax.top_k(scores_ne, self.k)
    else:
      balanced_ne = self._balanced(logits_ne, seq_len)
      if self.expert_dropout > 0:
        balanced_ne = routing.drop_experts(self.rngs(), balanced_ne, self.expert_dropout,
                                           -jnp.inf)
      _, sel_nk = jax.lax.top_k(balanced_ne, self.k)
    gates_nk = routing.gather_gates(scores_ne, sel_nk)
    reg = self.reg_coef * routing.entropy_regularizer(logits_ne)
    return routing.Routing(sel_nk.astype(jnp.int32), gates_nk, reg,
                           {"rerouted_fraction": rerouted_fraction(scores_ne, gates_nk, self.k)})
