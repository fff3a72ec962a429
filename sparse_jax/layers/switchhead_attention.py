"""SwitchHead: mixture-of-experts attention (Csordas et al. 2024), on our grouped expert matmul.

SwitchHead keeps the attention matrices of a few heads and makes each head's value and output
projections mixtures of experts. Attention cost and memory scale with the number of heads,
so a model with 2-4 SwitchHead heads matches the perplexity of a dense model with many more
heads at a fraction of the compute and memory. Per head h, with `E` experts and `K` active:

    q_h = x W_q[h],   k_h = x W_k[h]                  dense, no bias (rotary: q, k rotated)
    s^V_h = sigmoid(x_kv W_sV[h]),  s^O_h = sigmoid(x_q W_sO[h])       `[E]` per head
    V_h = sum_{e in topK(s^V_h)} s^V_h[e] x_v W_v[h, e]
    A_h = softmax(q_h k_h^T / sqrt(Dh) + causal mask) V_h
    y   = sum_h sum_{e in topK(s^O_h)} s^O_h[e] A_h W_o[h, e]

The gates are the raw sigmoids (not renormalised over the K). As in the authors' code the
V router reads the key/value side and the O router the query side; for self-attention both
are `x`, and the expert values may read another input (`v_btd`: MoEUT feeds the values the
un-normalised residual while Q, K and both routers read the LayerNorm output).

Facts read from the authors' code (RobertCsordas/switchhead `switchhead/switchhead.py`,
`SwitchHeadCore`, `SwitchHeadRope`; the same class in RobertCsordas/moeut `moeut/moeut.py`):
- parameters `q, k: Linear(d, H*Dh, bias=False)`, `v [H*E, d, Dh]`, `o [H*E, Dh, d]`,
  `sel_v, sel_o [H*E, d]` (expert `e` of head `h` is row `h*E + e`);
- `get_sel`: float32 logits, sigmoid, per-head top-K, gates gathered from the sigmoid;
- q and k each multiplied by `Dh^-1/4`, then attention with scale 1 (= q.k / sqrt(Dh) here);
- init with `s` (`sqrt(2 / n_layers)` in MoEUT, the per-layer `init_scale`): q, k, v and the
  routers `N(0, s / sqrt(d))`, o `N(0, s / sqrt(H Dh))`; the routers then go through
  `renorm_rows`: each row divided by its norm and multiplied by (its own std before the
  division) / (std of the whole divided matrix), both stds unbiased. This is NOT "equal-norm
  rows" (sigma-MoE's `renorm_keep_std` uses the matrix std): row norms end up proportional to
  the original row stds, so the step nearly undoes itself. We reproduce it exactly.
- `SwitchHeadRope` rotates only the first `int(rotate_fraction * Dh)` channels of q and k
  (rotate-half form over those channels, base 10000), `rotate_fraction = 0.5` by default;
  their training code (moeut_training_code) rounds that count down to even, which the
  standalone package fails on (an odd count): we round as the training code;
- dropout (`dropout`) acts on q in their code; here `attn_dropout` acts on the attention
  probabilities, as in the repo's other attention layers;
- with `n_experts == 1` their code is a different layer (dense V with no gate, dense O with a
  per-head sigmoid gate); this module needs `n_experts >= 2`.

Positions: `"rope"` (rotary on the first `rope_fraction * Dh` channels of q and k) or
`"none"`. `SwitchHeadXLAttention` (below) has Transformer-XL relative positions over
`[memory; segment]`, the paper's main rows.

Expert projections run on `pallas_kernels.cvmm` over the `H * E` experts (expert id
`h * E + e`); under a data-parallel mesh a GPU or TPU kernel runs on each device's rows
(`expert_parallel.token_parallel_cvmm`). V: the token rows replicated per head, `[N*H, d]`,
each with its head's K slots and gates, `cvmm(..) -> [N*H, Dh]` (the K-sum inside the call,
gates in float32). O: one call
sums heads and K (the authors' `sel_index = out_index // K`): the cvmm contract reads either
one row per token for all its slots or one row per slot, so each head's output is repeated
K times (`[N, H*K, Dh]`, slot `h*K + j` reads head h) and the gated reduction over all `H*K`
slots gives `[N, d]`.

Tensor parallelism (`mesh.tensor` = t, dividing H): split by head, as Megatron splits dense
attention. Q, K (and the XL form's `W_pos`) are split by XLA's partitioner; the V and O
experts (rows `h * E + e`, so whole heads' experts per device) run inside `shard_map`
(`expert_parallel.head_parallel`: left to the partitioner, the grouped matmul gathered every
device's experts each step): each device computes its heads' values, attends with them, and
one `psum` over `tensor` adds the O projection's partial sums over heads. The routers are
replicated: split by head, each router's input gradient would be all-reduced (`B x T x d`, 2
more per layer), where replicated only its logits' gradient is gathered (`B x T x H E`) and
XLA all-gathers its Adam update (`H E x d`, the weights' size, not the tokens').

Decoding keeps the rotated keys and the post-expert values in a head-major cache
`[B, H, max_len, Dh]` (`causal_attention.init_kv_cache`); routing is per token, so one step
equals the full forward on the prefix.
"""

import functools
import math

import jax
import jax.numpy as jnp
from flax import nnx

from pallas_kernels import backends
from pallas_kernels.xl_attention import use_fused
from sparse_jax import parallel, validation
from sparse_jax.layers import initializers, sequence_parallel
from sparse_jax.layers.expert_parallel import head_parallel, token_parallel_cvmm
from sparse_jax.layers.causal_attention import attend_cached, attend_causal, init_kv_cache
from sparse_jax.layers.cudnn_attention import check_core
from sparse_jax.layers.precision import f32_einsum
from sparse_jax.layers.rotary import apply_partial_rotary, rotated_channels
from sparse_jax.layers.xl_attention import attend_relative, sinusoid_embedding

POSITIONS = ("rope", "none")


def expert_rows(sel_bthk: jax.Array, n_rows: int) -> jax.Array:
  """Head-local expert ids `[B, T, H, K]` -> rows `h * E + e` of expert weights holding the
  `n_rows = H * E` experts of these H heads."""
  n_experts = n_rows // sel_bthk.shape[2]
  offsets_h1 = (jnp.arange(sel_bthk.shape[2], dtype=jnp.int32) * n_experts)[:, None]
  return sel_bthk + offsets_h1


def expert_values(v_btd: jax.Array, gates_bthk: jax.Array, sel_bthk: jax.Array,
                  w_v_rdc: jax.Array, *, cvmm) -> jax.Array:
  """`V_h = sum_k s_k v W_v[h, e_k]` -> `[B, T, H, Dh]` for the H heads of `gates`/`sel`
  (`w_v_rdc` their `H * E` experts): one `cvmm` over (token, head) rows."""
  b, t, d = v_btd.shape
  h, kk = sel_bthk.shape[2:]
  rows_nd = jnp.broadcast_to(v_btd[:, :, None, :], (b, t, h, d)).reshape(b * t * h, d)
  v_nc = cvmm(rows_nd, expert_rows(sel_bthk, w_v_rdc.shape[0]).reshape(b * t * h, kk),
              w_v_rdc, gates_bthk.reshape(b * t * h, kk).astype(v_btd.dtype))
  return v_nc.reshape(b, t, h, w_v_rdc.shape[2])


def expert_output(out_bthc: jax.Array, gates_bthk: jax.Array, sel_bthk: jax.Array,
                  w_o_rcd: jax.Array, *, cvmm) -> jax.Array:
  """`y = sum_h sum_k s_{h,k} A_h W_o[h, e_k]` -> `[B, T, d]` over the H heads of `out_bthc`
  (`w_o_rcd` their `H * E` experts): one `cvmm` over all `H * K` slots, each head's output
  repeated K times (slot `h * K + j` reads head h)."""
  b, t, h, c = out_bthc.shape
  kk = sel_bthk.shape[3]
  n = b * t
  slots_nsc = jnp.repeat(out_bthc.reshape(n, h, c), kk, axis=1)
  y_nd = cvmm(slots_nsc, expert_rows(sel_bthk, w_o_rcd.shape[0]).reshape(n, h * kk), w_o_rcd,
              gates_bthk.reshape(n, h * kk).astype(out_bthc.dtype))
  return y_nd.reshape(b, t, w_o_rcd.shape[2])


def renorm_rows(w_ed: jax.Array) -> jax.Array:
  """The authors' `renorm_rows` of the router init (module docstring): rows divided by their
  norm, times (the row's std before) / (the std of the divided matrix); unbiased stds."""
  row_std_e1 = jnp.std(w_ed, axis=-1, ddof=1, keepdims=True)
  unit_ed = w_ed / jnp.linalg.norm(w_ed, axis=-1, keepdims=True)
  return unit_ed * (row_std_e1 / jnp.std(unit_ed, ddof=1))


class SwitchHeadAttention(nnx.Module):
  """Causal SwitchHead attention: dense Q, K `[d, H, Dh]`; expert V `[H*E, d, Dh]` and O
  `[H*E, Dh, d]`; routers `sel_v`, `sel_o` `[H*E, d]`: `2 d H Dh + 2 H E d Dh + 2 H E d`
  parameters; KV-cache decoding.

  Called like the other attention layers: `y_btd = attn(x_btd)`; `apply_with_aux` also returns
  the routing diagnostics; `init_cache` / `decode` for one token at a time. `core`: where
  `A_h` is formed (`causal_attention.attend_causal`: "xla" with the `[B, H, T, T]` scores in
  memory, "cudnn" fused; `SwitchHeadXLAttention` keeps "auto" and picks its core by `impl`).
  """

  def __init__(self, d_model: int, n_heads: int, head_dim: int, n_experts: int, k: int, *,
               n_layers: int, positions: str = "rope", rope_fraction: float = 0.5,
               rope_base: float = 10000.0, attn_dropout: float = 0.0, impl: str = "auto",
               core: str = "auto", rngs: nnx.Rngs):
    for name, value in (("d_model", d_model), ("n_heads", n_heads), ("head_dim", head_dim),
                        ("n_layers", n_layers)):
      validation.require(isinstance(value, int) and value >= 1, name, "a positive int", value)
    validation.require(
        isinstance(n_experts, int) and n_experts >= 2, "n_experts",
        "an int >= 2 (the authors' n_experts == 1 is a different, dense layer)", n_experts)
    validation.require(isinstance(k, int) and 1 <= k <= n_experts, "k",
                       f"an int in [1, n_experts = {n_experts}]", k)
    validation.require(positions in POSITIONS, "positions", f"one of {POSITIONS}", positions)
    n_rotate = rotated_channels(rope_fraction, head_dim) if positions == "rope" else 0
    if positions == "rope":
      validation.require(
          0 < rope_fraction <= 1 and n_rotate >= 2, "rope_fraction",
          f"in (0, 1], rotating at least 2 of the head_dim = {head_dim} channels",
          rope_fraction)
    validation.require(0.0 <= attn_dropout < 1.0, "attn_dropout", "in [0, 1)", attn_dropout)
    backends.check_impl(impl)
    check_core(core, head_dim, attn_dropout)

    self.d_model, self.n_heads, self.head_dim = d_model, n_heads, head_dim
    self.n_experts, self.k, self.positions = n_experts, k, positions
    self.n_rotate, self.rope_base, self.impl, self.core = n_rotate, rope_base, impl, core

    in_init = jax.nn.initializers.normal(initializers.depth_scaled_std(d_model, n_layers))
    out_init = jax.nn.initializers.normal(
        initializers.depth_scaled_std(n_heads * head_dim, n_layers))
    n_rows = n_heads * n_experts
    self.w_q, self.w_k = (nnx.Param(in_init(rngs.params(), (d_model, n_heads, head_dim)),
                                    logical_axes=("embed", "heads", "head_dim"))
                          for _ in range(2))
    # The H*E expert rows are laid out as heads (not `experts`): this layer is not
    # expert-parallel, so its experts are never split over the `expert` mesh axis; `tensor`
    # splits them with their heads.
    self.w_v = nnx.Param(in_init(rngs.params(), (n_rows, d_model, head_dim)),
                         logical_axes=("heads", "embed", "head_dim"))
    self.w_o = nnx.Param(out_init(rngs.params(), (n_rows, head_dim, d_model)),
                         logical_axes=("heads", "head_dim", "embed"))
    self.sel_v, self.sel_o = (
        nnx.Param(renorm_rows(in_init(rngs.params(), (n_rows, d_model))),
                  logical_axes=("expert_scores", "embed")) for _ in range(2))
    self.attn_dropout = nnx.Dropout(attn_dropout, rngs=rngs)

  # --- pieces -------------------------------------------------------------------------------

  def route(self, x_btd: jax.Array, w_sel: nnx.Param
            ) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Per-head sigmoid top-K: gates `[B, T, H, K]` float32 (the raw sigmoids), expert ids
    `[B, T, H, K]` int32 in `[0, E)` within each head, and the logits `[B, T, H, E]` float32."""
    b, t, _ = x_btd.shape
    logits_bte = f32_einsum("btd,ed->bte", x_btd, w_sel[...].astype(x_btd.dtype))
    logits_bthe = logits_bte.reshape(b, t, self.n_heads, self.n_experts)
    gates_bthk, sel_bthk = jax.lax.top_k(jax.nn.sigmoid(logits_bthe), self.k)
    return gates_bthk, sel_bthk.astype(jnp.int32), logits_bthe

  def _rotate(self, x_bthc: jax.Array, positions_t: jax.Array) -> jax.Array:
    if self.positions == "none":
      return x_bthc
    return apply_partial_rotary(x_bthc, positions_t, self.n_rotate, self.rope_base)

  def project_qk(self, x_btd: jax.Array, positions_t: jax.Array):
    """q, k `[B, T, H, Dh]` at absolute positions `[T]` (rotated with `positions="rope"`)."""
    dtype = x_btd.dtype
    q_bthc = jnp.einsum("btd,dhc->bthc", x_btd, self.w_q[...].astype(dtype))
    k_bthc = jnp.einsum("btd,dhc->bthc", x_btd, self.w_k[...].astype(dtype))
    return self._rotate(q_bthc, positions_t), self._rotate(k_bthc, positions_t)

  def _experts(self, per_heads, x, x_axes, gates_bthk, sel_bthk, w: nnx.Param,
               sum_heads: bool) -> jax.Array:
    """`per_heads` on all heads, or on each device's heads with the heads split over the
    ambient mesh's `tensor` axis (`expert_parallel.head_parallel`)."""
    w_rml = w[...].astype(x.dtype)
    mesh = jax.sharding.get_abstract_mesh()
    if parallel.axis_size(mesh, parallel.TENSOR) > 1:
      return head_parallel(per_heads, x, x_axes, gates_bthk, sel_bthk, w_rml, impl=self.impl,
                           sum_heads=sum_heads,
                           scatter=sum_heads and sequence_parallel.active())
    return per_heads(x, gates_bthk, sel_bthk, w_rml,
                     cvmm=functools.partial(token_parallel_cvmm, impl=self.impl))

  def project_v(self, v_btd: jax.Array, gates_bthk: jax.Array, sel_bthk: jax.Array):
    """`V_h = sum_k s_k v W_v[h, e_k]` -> `[B, T, H, Dh]` (`expert_values`)."""
    return self._experts(expert_values, v_btd, ("batch", None, None), gates_bthk, sel_bthk,
                         self.w_v, sum_heads=False)

  def project_out(self, out_bthc: jax.Array, gates_bthk: jax.Array, sel_bthk: jax.Array):
    """`y = sum_h sum_k s_{h,k} A_h W_o[h, e_k]` -> `[B, T, d]` (`expert_output`)."""
    return self._experts(expert_output, out_bthc, ("batch", None, "heads", None), gates_bthk,
                         sel_bthk, self.w_o, sum_heads=True)

  def _aux(self, sel_v_bthk: jax.Array, sel_o_bthk: jax.Array, v_logits_bthe: jax.Array,
           o_logits_bthe: jax.Array) -> dict[str, jax.Array]:
    n = sel_v_bthk.shape[0] * sel_v_bthk.shape[1]

    def share(sel_bthk):  # [H, E]: fraction of tokens each head's expert processes
      one_hot = jax.nn.one_hot(sel_bthk, self.n_experts, dtype=jnp.float32)
      return jnp.sum(one_hot, axis=(0, 1, 3)) / n

    return {"reg_loss": jnp.zeros((), jnp.float32),
            "v_selection": sel_v_bthk, "o_selection": sel_o_bthk,
            "v_token_share": share(sel_v_bthk), "o_token_share": share(sel_o_bthk),
            "v_logits": v_logits_bthe, "o_logits": o_logits_bthe}

  # --- calls --------------------------------------------------------------------------------

  def apply_with_aux(self, x_btd: jax.Array, v_btd: jax.Array | None = None
                     ) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Causal self-attention `[B, T, d] -> [B, T, d]` and the routing diagnostics:

    - `reg_loss`: 0 (the paper's configs use no attention regulariser);
    - `v_selection`, `o_selection` `[B, T, H, K]` int32: each head's chosen experts, in [0, E);
    - `v_token_share`, `o_token_share` `[H, E]` float32: the fraction of the tokens each
      head's expert processes (each head's row sums to K), the `token_share` of
      `training.routing_health` per head;
    - `v_logits`, `o_logits` `[B, T, H, E]` float32: the routers' logits (MoEUT's
      regulariser across a shared layer's repeats, `models.moeut_regularizer`).

    `v_btd` (default `x_btd`): the input of the expert values; the V router still reads x.
    Under sequence parallelism (`layers.sequence_parallel`) the inputs arrive on sequence
    shards and are read whole; the output returns reduce-scattered onto the shards.
    """
    t = x_btd.shape[1]
    v_btd = x_btd if v_btd is None else v_btd
    if sequence_parallel.active():
      x_btd, v_btd = parallel.whole_sequences(x_btd), parallel.whole_sequences(v_btd)
    q_bthc, k_bthc = self.project_qk(x_btd, jnp.arange(t))
    gates_v, sel_v, logits_v = self.route(x_btd, self.sel_v)
    gates_o, sel_o, logits_o = self.route(x_btd, self.sel_o)
    v_bthc = self.project_v(v_btd, gates_v, sel_v)
    out_bthc = attend_causal(q_bthc, k_bthc, v_bthc, self.attn_dropout, self.core)
    return (self.project_out(out_bthc, gates_o, sel_o),
            self._aux(sel_v, sel_o, logits_v, logits_o))

  def __call__(self, x_btd: jax.Array) -> jax.Array:
    """Causal self-attention over the sequence, `[B, T, d_model] -> [B, T, d_model]`."""
    return self.apply_with_aux(x_btd)[0]

  def init_cache(self, batch: int, max_len: int, dtype) -> dict[str, jax.Array]:
    """Zero caches of rotated keys and post-expert values, `[B, H, max_len, Dh]` each."""
    return init_kv_cache(batch, max_len, self.n_heads, self.head_dim, dtype)

  def decode(self, x_b1d: jax.Array, cache: dict, position: jax.Array,
             v_b1d: jax.Array | None = None) -> tuple[jax.Array, dict]:
    """One token at absolute `position` (int32 scalar, < max_len): `y [B, 1, d_model]`, cache."""
    v_b1d = x_b1d if v_b1d is None else v_b1d
    q_b1hc, k_b1hc = self.project_qk(x_b1d, jnp.reshape(position, (1,)))
    v_b1hc = self.project_v(v_b1d, *self.route(x_b1d, self.sel_v)[:2])
    out_b1hc, cache = attend_cached(q_b1hc, k_b1hc, v_b1hc, cache, position,
                                    self.attn_dropout)
    return self.project_out(out_b1hc, *self.route(x_b1d, self.sel_o)[:2]), cache

  # --- accounting ---------------------------------------------------------------------------

  def flops_per_token(self) -> int:
    """Multiply-adds of one token's projections: `2 d H Dh` (Q, K) + `2 K H d Dh` (K experts
    of V and of O per head) + `2 d H E` (the two routers).

    Excludes, like `CausalSelfAttention.flops_per_token`, the attention itself (`2 H Dh` per
    visible key), the gate products and the rotary rotation.
    """
    d, h, c = self.d_model, self.n_heads, self.head_dim
    return 2 * d * h * c + 2 * self.k * h * d * c + 2 * d * h * self.n_experts


_XL_DECODING = ("SwitchHeadXLAttention decodes through the XL memory (TransformerLM.decode_step "
                "runs the model on each new token with its memory), not a KV cache")


class SwitchHeadXLAttention(SwitchHeadAttention):
  """SwitchHead with Transformer-XL relative positions over `[memory; segment]`: the paper's
  main rows (the authors' `FullMoeRelativeAttention`, RobertCsordas/moe_attention
  `layers/transformer/full_moe_relative_attention.py`; `SwitchHeadXL` in their switchhead
  package). Called as `RelativeMultiHeadAttention`: `y = attn(ctx_bkd, T, mem_valid)`.

  For query i of the segment (absolute position M + i) and key j of the context:

      score = (q_i . k_j + q_i . P(j - M - i) W_pos[h]) / sqrt(Dh)

  `P` the sinusoid of the *signed* offset key minus query (<= 0 where visible), sin and cos
  interleaved, of size d_model; `W_pos [d, H, Dh]` one projection for all experts, init
  `N(0, sqrt(2 / (n_layers d)))`. Unlike `RelativeMultiHeadAttention`: no u/v biases, a fixed
  scale (their q and k each times `Dh^-1/4`, the embedding too). K, V and the V router read
  the whole normalised context (the V experts recompute the memory rows every step, as
  theirs); Q and the O router read the segment. The V routing shares in the aux count the
  segment's tokens only.
  """

  def __init__(self, d_model: int, n_heads: int, head_dim: int, n_experts: int, k: int, *,
               n_layers: int, attn_dropout: float = 0.0, impl: str = "auto", rngs: nnx.Rngs):
    super().__init__(d_model, n_heads, head_dim, n_experts, k, n_layers=n_layers,
                     positions="none", attn_dropout=attn_dropout, impl=impl, rngs=rngs)
    pos_init = jax.nn.initializers.normal(initializers.depth_scaled_std(d_model, n_layers))
    self.w_pos = nnx.Param(pos_init(rngs.params(), (d_model, n_heads, head_dim)),
                           logical_axes=("embed", "heads", "head_dim"))

  def apply_with_aux(self, ctx_bkd: jax.Array | tuple[jax.Array, ...], n_queries: int,
                     mem_valid: jax.Array) -> tuple[jax.Array, dict[str, jax.Array]]:
    """The last `n_queries` rows of the normalised context `[B, K, d]` attend to all of it
    (`mem_valid` trailing memory rows are real): `[B, T, d]` and the routing diagnostics
    (`SwitchHeadAttention.apply_with_aux`; V selections of the segment only). Under
    sequence parallelism the context comes as its parts (memory, segment), each on its
    sequence shards, read whole (`RelativeMultiHeadAttention`)."""
    if isinstance(ctx_bkd, (tuple, list)):
      ctx_bkd = jnp.concatenate([parallel.whole_sequences(part) for part in ctx_bkd], axis=1)
    dtype = ctx_bkd.dtype
    k, t = ctx_bkd.shape[1], n_queries
    x_btd = ctx_bkd[:, k - t:]
    q_bthc = jnp.einsum("btd,dhc->bthc", x_btd, self.w_q[...].astype(dtype))
    k_bkhc = jnp.einsum("bkd,dhc->bkhc", ctx_bkd, self.w_k[...].astype(dtype))
    gates_v, sel_v, logits_v = self.route(ctx_bkd, self.sel_v)
    gates_o, sel_o, logits_o = self.route(x_btd, self.sel_o)
    v_bkhc = self.project_v(ctx_bkd, gates_v, sel_v)
    # Row p of the relative embeddings is distance K - 1 - p (`rel_shift`), offset -(K - 1 - p).
    pos_kd = sinusoid_embedding(-jnp.arange(k - 1, -1, -1), self.d_model, interleaved=True)
    r_khc = jnp.einsum("kd,dhc->khc", pos_kd.astype(dtype), self.w_pos[...].astype(dtype))
    # "pallas" runs the attention core in the fused XL kernels too (`pallas_kernels.
    # xl_attention`), where there is no attention dropout; "auto" does on one GPU.
    fused = self.attn_dropout.rate == 0 and use_fused(self.impl, self.attn_dropout.rate)
    out_bthc = attend_relative(q_bthc, q_bthc, k_bkhc, v_bkhc, r_khc,
                               1 / math.sqrt(self.head_dim), mem_valid, self.attn_dropout,
                               fused=fused)
    return self.project_out(out_bthc, gates_o, sel_o), self._aux(
        sel_v[:, k - t:], sel_o, logits_v[:, k - t:], logits_o)

  def __call__(self, ctx_bkd: jax.Array | tuple[jax.Array, ...], n_queries: int,
               mem_valid: jax.Array) -> jax.Array:
    return self.apply_with_aux(ctx_bkd, n_queries, mem_valid)[0]

  def init_cache(self, batch: int, max_len: int, dtype):
    raise NotImplementedError(_XL_DECODING)

  def decode(self, x_b1d, cache, position, v_b1d=None):
    raise NotImplementedError(_XL_DECODING)
