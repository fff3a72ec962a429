"""SPARTAN sparse hierarchical memory (Deshpande et al. 2022, Sec. 3, Eq. 1-3).

A memory shared by all positions, added after a Transformer layer whose backbone stays frozen.
Each position `v` attends over `N_p` parent cells, keeps the top-K parents (Eq. 1), reads each
kept parent's `N_c` exclusive children as a key-value memory (Eq. 2), and adds the parents'
renormalised mixture of those reads back to `v` (Eq. 3). Only the K kept parents' children
are gathered, never all `N_p * N_c`: that sparsity is what the paper's speed claim rests on.

Tensor parallelism (`sparse_jax.parallel`) leaves the memory whole on every device of `tensor`:
its tables are declared `memory` and `embed`, which `RULES` split over `fsdp` only. Split by
parent, Eq. 1's top-K would need every parent's logit (an all-gather of `[N, N_p]`) and Eq. 3's
sum over the kept parents an all-reduce of `B x T x d` forward and backward, as a whole FF
sublayer costs, for `(N_p + 2 N_p N_c) d` scalars (97 d at the paper's N_p 16, N_c 3: 1/63 of a
dense FF's `8 d^2` at d 768) and `(N_p + 2 K N_c) d` multiply-adds per token. Whole, it reads
the layer's output, which every device of `tensor` holds whole, computes what one device
computes and needs no collective.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from sparse_jax import validation
from sparse_jax.layers.feed_forward import FeedForward
from sparse_jax.layers.param_types import PlugInParam

REFERENCE_TEMPERATURE = 1.6  # princeton-nlp/SPARTAN divides child logits by this; Eq. 2 has none.


def _compute_dtype(dtype) -> jnp.dtype:
  """Scores and softmaxes in at least float32 (float64 stays float64 for gradient checks)."""
  return jnp.promote_types(dtype, jnp.float32)


def select_parents(x_nd: jax.Array, parents_pd: jax.Array, top_k: int):
  """Eq. 1 and Eq. 3's renormalisation: `(g [N, K], parent ids [N, K])`.

  `softmax(P v)` restricted to its top-K entries and divided by their sum `Z` equals the
  softmax of the K largest logits, which is what is computed (no underflow of small `g`).
  """
  logits_np = jnp.einsum("nd,pd->np", x_nd, parents_pd,
                         preferred_element_type=_compute_dtype(x_nd.dtype))
  top_logits_nk, ids_nk = jax.lax.top_k(logits_np, top_k)
  return jax.nn.softmax(top_logits_nk, axis=-1), ids_nk


def gather_children(child_keys_pcd: jax.Array, child_values_pcd: jax.Array,
                    ids_nk: jax.Array) -> tuple[jax.Array, jax.Array]:
  """The children of the chosen parents only: keys and values `[N, K, N_c, d]` (one take each)."""
  return jnp.take(child_keys_pcd, ids_nk, axis=0), jnp.take(child_values_pcd, ids_nk, axis=0)


def _child_read_forward(x_nd, keys_pcd, values_pcd, ids_nk, g_nk, temperature):
  """Eq. 2 and Eq. 3's sum for the gathered children: `v_O [N, d]` and child attention."""
  dtype = x_nd.dtype
  keys_nkcd, values_nkcd = gather_children(keys_pcd, values_pcd, ids_nk)
  child_logits_nkc = jnp.einsum("nd,nkcd->nkc", x_nd, keys_nkcd,
                                preferred_element_type=_compute_dtype(dtype))
  attn_nkc = jax.nn.softmax(child_logits_nkc / temperature, axis=-1)
  weights_nkc = (g_nk[..., None] * attn_nkc).astype(dtype)
  return jnp.einsum("nkc,nkcd->nd", weights_nkc, values_nkcd), attn_nkc


def _per_child(ids_nk: jax.Array, per_slot_nkc: jax.Array, n_parents: int) -> jax.Array:
  """`out[n, p, c] = sum_k [ids[n, k] = p] per_slot[n, k, c]`: slots laid out densely."""
  one_hot_nkp = jax.nn.one_hot(ids_nk, n_parents, dtype=per_slot_nkc.dtype)
  return jnp.einsum("nkp,nkc->npc", one_hot_nkp, per_slot_nkc)


@functools.partial(jax.custom_vjp, nondiff_argnums=(5,))
def child_read(x_nd, keys_pcd, values_pcd, ids_nk, g_nk, temperature):
  """`v_O = sum_k g_k C_{i_k}^V^T softmax(C_{i_k}^K v / temperature)` (Eq. 2-3), `[N, d]`.

  The forward reads only the K chosen parents' children (one take per table). The
  gradient of a take is a scatter-add of `N K N_c d` rows, which XLA's CPU backend runs
  element by element; the custom VJP instead lays the per-slot coefficients out densely as
  `[N, N_p, N_c]` (few numbers) and forms each table's gradient with one matmul against `x`
  or the output gradient, e.g. `dC^V = sum_n w[n, p, c] dy[n]`.
  """
  return _child_read_forward(x_nd, keys_pcd, values_pcd, ids_nk, g_nk, temperature)[0]


def _child_read_fwd(x_nd, keys_pcd, values_pcd, ids_nk, g_nk, temperature):
  v_out_nd, attn_nkc = _child_read_forward(x_nd, keys_pcd, values_pcd, ids_nk, g_nk,
                                           temperature)
  return v_out_nd, (x_nd, keys_pcd, values_pcd, ids_nk, g_nk, attn_nkc)


def _child_read_bwd(temperature, residuals, dy_nd):
  x_nd, keys_pcd, values_pcd, ids_nk, g_nk, attn_nkc = residuals
  n_parents, compute = keys_pcd.shape[0], attn_nkc.dtype
  keys_nkcd, values_nkcd = gather_children(keys_pcd, values_pcd, ids_nk)
  dweights_nkc = jnp.einsum("nd,nkcd->nkc", dy_nd, values_nkcd, preferred_element_type=compute)
  dg_nk = jnp.sum(dweights_nkc * attn_nkc, axis=-1)
  dattn_nkc = dweights_nkc * g_nk[..., None]
  dlogits_nkc = attn_nkc * (dattn_nkc - jnp.sum(dattn_nkc * attn_nkc, -1, keepdims=True))
  dlogits_nkc = dlogits_nkc / temperature
  dx_nd = jnp.einsum("nkc,nkcd->nd", dlogits_nkc.astype(x_nd.dtype), keys_nkcd)
  dkeys_pcd = jnp.einsum("npc,nd->pcd", _per_child(ids_nk, dlogits_nkc, n_parents).astype(
      x_nd.dtype), x_nd)
  weights_nkc = g_nk[..., None] * attn_nkc
  dvalues_pcd = jnp.einsum("npc,nd->pcd", _per_child(ids_nk, weights_nkc, n_parents).astype(
      dy_nd.dtype), dy_nd)
  ids_zero = np.zeros(ids_nk.shape, dtype=jax.dtypes.float0)
  return (dx_nd, dkeys_pcd.astype(keys_pcd.dtype), dvalues_pcd.astype(values_pcd.dtype),
          ids_zero, dg_nk.astype(g_nk.dtype))


child_read.defvjp(_child_read_fwd, _child_read_bwd)


def dense_child_read(x_nd, keys_pcd, values_pcd, ids_nk, g_nk, temperature):
  """`child_read`'s value from all `N_p N_c` children with two matmuls, `[N, d]`.

  Scores every child (`x C^K^T`), takes each parent's child softmax, weights it by the
  renormalised `g` of the chosen parents (zero elsewhere) and reads the values with one
  matmul. It touches unchosen children, but never copies rows per position: with the
  paper's N_p = 16 and K = 8 the chosen parents are half of all, and gathering
  `[N, K, N_c, d]` copies is memory-bound. On 2 CPU cores, RoBERTa-base with 12 SPARTAN
  memories (batch 32 x 128) ran inference 1.25x faster with this read than with the gather
  (`benchmarks/spartan_throughput.py`, RESULTS.md).
  """
  n_parents, n_children, d = keys_pcd.shape
  logits_npc = jnp.einsum("nd,pcd->npc", x_nd, keys_pcd,
                          preferred_element_type=_compute_dtype(x_nd.dtype))
  attn_npc = jax.nn.softmax(logits_npc / temperature, axis=-1)
  g_np = jnp.einsum("nkp,nk->np", jax.nn.one_hot(ids_nk, n_parents, dtype=g_nk.dtype), g_nk)
  weights_nm = (g_np[..., None] * attn_npc).astype(x_nd.dtype).reshape(-1, n_parents * n_children)
  return weights_nm @ values_pcd.reshape(n_parents * n_children, d)


READS = {"gather": child_read, "dense": dense_child_read}


def choose_read(n_parents: int, top_k: int) -> str:
  """`auto`: dense when the chosen parents are at least a quarter of all (see
  `dense_child_read`), else the sparse gather."""
  return "dense" if n_parents <= 4 * top_k else "gather"


def spartan_memory(x_nd: jax.Array, parents_pd: jax.Array, child_keys_pcd: jax.Array,
                   child_values_pcd: jax.Array, *, top_k: int, temperature: float = 1.0,
                   read: str = "gather"):
  """Eq. 1-3 for rows `x [N, d]`: returns `(x + v_O [N, d], parent ids [N, K])`.

  Eq. 2 per kept parent i: `v_i = C_i^V^T softmax(C_i^K v / temperature)`; Eq. 3:
  `v_O = sum_i g_i v_i` with the renormalised `g` of `select_parents`. `read` is "gather"
  (only the K chosen parents' children are read: `child_read`) or "dense"
  (`dense_child_read`); both give the same values.
  """
  dtype = x_nd.dtype
  g_nk, ids_nk = select_parents(x_nd, parents_pd.astype(dtype), top_k)
  v_out_nd = READS[read](x_nd, child_keys_pcd.astype(dtype), child_values_pcd.astype(dtype),
                         ids_nk, g_nk, float(temperature))
  return x_nd + v_out_nd, ids_nk


def spartan_params(d_model: int, n_parents: int, n_children: int, n_layers: int = 1) -> int:
  """Trainable scalars of Sec. 3's memory: `(N_p + 2 N_p N_c) d` per layer (P, C^K, C^V).

  App. E's storage formula counts `2 (N_p + N_p N_c) d` per layer instead (1.18M for
  RoBERTa-base, which is what its 133.62M total implies, and Pfeiffer's `2 d b` at b = 64).
  """
  return (n_parents + 2 * n_parents * n_children) * d_model * n_layers


class SpartanMemory(FeedForward):
  """The SPARTAN memory as a block: `y, aux = memory(x)`, `y = x + v_O` (Eq. 1-3).

  Parameters, parent axis first so the chosen parents' children are one take:
  `parents [N_p, d]`, `child_keys [N_p, N_c, d]`, `child_values [N_p, N_c, d]`; in all
  `(N_p + 2 N_p N_c) d` scalars (`spartan_params`; App. E's formula differs, see there).

  Initialisation: neither the paper nor the public reference README states one, so all three
  tensors are `N(0, init_std^2)` with `init_std = 0.02` (RoBERTa's `initializer_range`). Then
  routing is near uniform and `v_O`, a convex mixture of `K N_c` small random vectors, has
  norm about `init_std sqrt(d / (K N_c))`, so the output starts close to `v`.

  `temperature` divides the child logits (Eq. 2 has none: default 1.0); the reference code uses
  1.6 (`REFERENCE_TEMPERATURE`). `read` picks how the chosen children are read: "gather"
  (only theirs, `child_read`), "dense" (all, two matmuls, `dense_child_read`; same values) or
  "auto" (`choose_read`: dense when K >= N_p / 4, as at the paper's N_p 16, K 8). aux:
  `reg_loss` (zero; no auxiliary loss in the paper) and `parent_usage [N_p]`, how many
  positions chose each parent.
  """

  def __init__(self, d_model: int, n_parents: int = 16, n_children: int = 3, top_k: int = 8,
               *, temperature: float = 1.0, init_std: float = 0.02, read: str = "auto",
               rngs: nnx.Rngs):
    validation.require_positive_int(d_model, "d_model")
    validation.require_positive_int(n_parents, "n_parents")
    validation.require_positive_int(n_children, "n_children")
    validation.require(isinstance(top_k, int) and 0 < top_k <= n_parents, "top_k",
                       f"an integer in [1, n_parents={n_parents}]", top_k)
    validation.require(isinstance(temperature, (int, float)) and temperature > 0,
                       "temperature", "a positive number", temperature)
    validation.require(isinstance(init_std, (int, float)) and init_std > 0, "init_std",
                       "a positive number", init_std)
    self.d_model, self.n_parents, self.n_children = d_model, n_parents, n_children
    validation.require_choice(read, "read", ("auto", *READS))
    self.top_k, self.temperature = top_k, float(temperature)
    self.read = choose_read(n_parents, top_k) if read == "auto" else read
    init = jax.nn.initializers.normal(init_std)
    children_axes = ("memory", "memory", "embed")  # parent, child within it, width
    self.parents = PlugInParam(init(rngs.params(), (n_parents, d_model)),
                             logical_axes=("memory", "embed"))
    self.child_keys = PlugInParam(init(rngs.params(), (n_parents, n_children, d_model)),
                                logical_axes=children_axes)
    self.child_values = PlugInParam(init(rngs.params(), (n_parents, n_children, d_model)),
                                  logical_axes=children_axes)

  def __call__(self, x: jax.Array) -> tuple[jax.Array, dict[str, jax.Array]]:
    y_nd, ids_nk = spartan_memory(
        self.token_rows(x, self.d_model), self.parents[...], self.child_keys[...],
        self.child_values[...], top_k=self.top_k, temperature=self.temperature,
        read=self.read)
    usage_p = jnp.zeros((self.n_parents,), jnp.int32).at[ids_nk].add(1)
    return y_nd.reshape(x.shape), {"reg_loss": jnp.zeros((), jnp.float32),
                                   "parent_usage": usage_p}

  def flops_per_token(self) -> int:
    """Multiply-adds: all parent scores, then keys and values of the children read (the K
    kept parents' when gathering, all of them when dense)."""
    read_parents = self.top_k if self.read == "gather" else self.n_parents
    return (self.n_parents + 2 * read_parents * self.n_children) * self.d_model
