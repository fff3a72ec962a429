"""MoEUT (shared blocks, peri-LayerNorm, the regulariser) against the authors' PyTorch model,
on the same weights and inputs.

`tests/data/moeut_reference/outputs.npz` holds, from their `MoEUT` and `MoEUTLM`
(RobertCsordas/moeut, `moeut/moeut.py`; the commit and torch version are in the npz) run in
float64 by `make_reference.py` there (which says what its harness changes to run their code on
a CPU in float64: Triton kernels emulated, their float32 router logits and RoPE frequencies
kept in float64):
- the stack (`MoEUT`: 4 layers of G = 2 shared `MoEUTLayer`s, ABAB, on hidden states x
  [2, 5, 24]): its output, every router's logits per layer, the regulariser per group and
  router (unscaled) and in total (their coefficients, 0.01 FF and 0.001 attention), the
  gradients of `sum(out * R) + reg_loss` wrt x and every weight, and those of `reg_loss`
  alone wrt x, the routers and the LayerNorms;
- their LM (`MoEUTLM`: embedding, the same stack weights, `out_norm`, `lm_head` with a bias)
  on tokens: logits, the regulariser, and the gradients of `sum(logits * R) + reg_loss` wrt
  its embedding, out_norm and lm_head.
Nothing here needs torch or their code.

Ours: a `TransformerLM` with `layer_groups=2`, `n_layers=4`, `block_norm="peri"`, SwitchHead
attention (RoPE on half of each head), a sigma-MoE FF (reg_coef 0: MoEUT's regulariser
replaces sigma-MoE's), `moeut_ff_reg` / `moeut_attention_reg` set to their coefficients. The
stack runs as `TransformerLM.hidden_states` runs it: `block(h, None, None)` over
`lm.layer_blocks`, the regulariser `moeut_regularizer` over the blocks' aux under keys
`layer{i}/...` (plus each block's own `reg_loss`, 0 here); the LM is `lm(tokens)`.

Their weights map to ours as (group g = our `blocks[g]`; their layer r*G + g is our layer
r*G + g, both ABAB):
  layers.g.ln1.{weight, bias}             ->  blocks[g].attn_norm.{scale, bias}
  layers.g.ln2.{weight, bias}             ->  blocks[g].ff_norm.{scale, bias}
  layers.g.attention.{q, k}.weight [H*Dh, d] (y = x W^T)  ->  attn.w_q, w_k = W^T as [d, H, Dh]
  layers.g.attention.{v, o, sel_v, sel_o}  ->  attn.w_v, w_o, sel_v, sel_o as they are
                                              (expert e of head h is row h*E + e on both sides)
  layers.g.ffn.keys [E, d, G]              ->  ff.w_up
  layers.g.ffn.values [E, G, d]            ->  ff.w_down
  layers.g.ffn.expert_sel [E, d]           ->  ff.router.w_sel
  embedding.weight [V, d]                  ->  embed.embedding
  out_norm.{weight, bias}                  ->  final_norm.{scale, bias}
  lm_head.weight [V, d], lm_head.bias      ->  w_out = W^T [d, V], b_out

What is adjusted to compare (our code is unchanged):
- LayerNorm epsilon: theirs is torch's default 1e-5 (`torch.nn.LayerNorm(d_model)`, moeut.py
  lines 380-381, 458); ours is `model.layer_norm_eps`, 1e-6 by default and in
  `sparse_jax/configs/moeut_paper.py`. Here `layer_norm_eps` is set to theirs (saved in the npz).
- Their stack needs a mask (`~mask`, line 366, fails on None): the harness passes the causal
  mask their LM builds (lines 471-472); ours is causal by construction.
- Their total `reg_loss` is accumulated in a float32 tensor (line 423), so it is compared with
  `reg/total64`, the same sum of their float64 terms; the float32 total is within 1e-7 of it.
- Dropout is 0 on both sides: theirs drops only the attention's update (`self.drop`, lines
  387-389; their SwitchHead gets no dropout from `MoEUTLayer`, line 376), ours
  `model.dropout` drops both sublayers' updates and `attn_dropout` the attention
  probabilities.

Two comparisons:
- the cheap CPU impls of cvmm and the expert MLP (float32, the model as it runs): float32
  tolerances;
- the model's own code in float64 at float64 tolerances, with the helpers that compute in
  float32 whatever their input (`rotary.apply_rotary`, SwitchHead's `cvmm`, the FF's
  `pallas_kernels.expert_mlp`, `moeut_regularizer.negative_sequence_entropy`) swapped for
  float64 versions of the same formulas: this checks the wiring (sharing order, where each
  LayerNorm is read, routing, gates, RoPE, the regulariser's grouping over repeats, time,
  heads and sequences, its coefficients) to float64 rounding; the float32 helpers are what the
  first comparison checks.
"""

import functools
import math
import os

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from flax import nnx
from float64_helpers import apply_rotary_float64, cvmm_float64

import pallas_kernels
from sparse_jax.configs import default
from sparse_jax.layers import rotary
from sparse_jax.models import moeut_regularizer as moeut_reg
from sparse_jax.models.lm import TransformerLM

NPZ = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data",
                   "moeut_reference", "outputs.npz")
IMPLS = ["gather", "blocked"]
# XLA:CPU's LLVM backend at optimisation level 0: half the compile time of this test (the
# same computation; only the order of some roundings may differ, far within the tolerances).
JIT_OPTIONS = {"xla_backend_optimization_level": 0}
# Theirs (unscaled terms `reg/group{g}/{router}`) <- the key of our block aux holding the
# router's logits.
ROUTER_KEYS = {"ff": "router_logits", "attn_o": "attn_o/logits", "attn_v": "attn_v/logits"}


@pytest.fixture(scope="module")
def ref():
  with np.load(NPZ) as data:
    ref = dict(data)
  ref["dims"] = {str(k): int(v) for k, v in zip(ref["shape_names"], ref["shape"])}
  return ref


# --- weights ---------------------------------------------------------------------------------

def weight_map(dims: dict) -> dict:
  """Our parameter path (tuple) -> (their name, ours <- theirs, theirs <- ours)."""
  d, h, c = dims["d_model"], dims["heads"], dims["head_dim"]
  same = (lambda w: w, lambda w: w)
  qk = (lambda w: w.T.reshape(d, h, c), lambda w: w.reshape(d, h * c).T)
  transposed = (lambda w: w.T, lambda w: w.T)
  table = {}
  for g in range(dims["groups"]):
    layer = f"layers.{g}"
    for ours, theirs, conv in (
        (("attn_norm", "scale"), "ln1.weight", same), (("attn_norm", "bias"), "ln1.bias", same),
        (("ff_norm", "scale"), "ln2.weight", same), (("ff_norm", "bias"), "ln2.bias", same),
        (("attn", "w_q"), "attention.q.weight", qk), (("attn", "w_k"), "attention.k.weight", qk),
        (("attn", "w_v"), "attention.v", same), (("attn", "w_o"), "attention.o", same),
        (("attn", "sel_v"), "attention.sel_v", same),
        (("attn", "sel_o"), "attention.sel_o", same),
        (("ff", "w_up"), "ffn.keys", same), (("ff", "w_down"), "ffn.values", same),
        (("ff", "router", "w_sel"), "ffn.expert_sel", same)):
      table[("blocks", g, *ours)] = (f"{layer}.{theirs}", *conv)
  table[("embed", "embedding")] = ("embedding.weight", *same)
  table[("final_norm", "scale")] = ("out_norm.weight", *same)
  table[("final_norm", "bias")] = ("out_norm.bias", *same)
  table[("w_out",)] = ("lm_head.weight", *transposed)
  table[("b_out",)] = ("lm_head.bias", *same)
  return table


def their_param(ref: dict, name: str) -> np.ndarray:
  """A weight of theirs: the stack's under `param/`, the LM's own under `lm/param/`."""
  return ref[f"param/{name}"] if f"param/{name}" in ref else ref[f"lm/param/{name}"]


def get_path(tree, path):
  for key in path:
    tree = tree[key]
  return tree


def build(ref: dict, impl: str, dtype):
  """Our LM holding their weights: (graphdef, params, rest)."""
  dims, coefs = ref["dims"], [float(v) for v in ref["coefs"]]
  cfg = default.get_config().model
  cfg.update(vocab_size=dims["vocab"], d_model=dims["d_model"], n_layers=dims["n_layers"],
             n_heads=dims["heads"], head_dim=dims["head_dim"], mem_len=0,
             attention="switchhead", positions="rotary", attention_experts=dims["att_e"],
             attention_k=dims["att_k"], attention_impl=impl, layer_groups=dims["groups"],
             block_norm="peri", moeut_ff_reg=coefs[0], moeut_attention_reg=coefs[1],
             dropout=0.0, tie_embeddings=False, layer_norm_eps=float(ref["layer_norm_eps"]))
  cfg.ff = ml_collections.ConfigDict(dict(
      kind="sigma_moe", n_experts=dims["ff_e"], expert_size=dims["ff_size"], k=dims["ff_k"],
      expert_dropout=0.0, reg_coef=0.0, impl=impl))
  lm = TransformerLM(cfg, rngs=nnx.Rngs(0))
  assert lm.n_groups == dims["groups"] and len(lm.blocks) == dims["groups"]
  assert lm.blocks[0].attn.n_rotate == int(float(ref["rotate_fraction"]) * dims["head_dim"])
  assert lm.blocks[0].attn.rope_base == float(ref["rope_base"])
  # The compute dtype `_embed` casts to and the one nnx.Embed computes in (fixed to its
  # parameter dtype, float32, at construction): float64 in the wiring check.
  lm.dtype = lm.embed.dtype = dtype
  graphdef, params, rest = nnx.split(lm, nnx.Param, ...)
  pure = nnx.to_pure_dict(params)
  table = weight_map(dims)
  leaves = [tuple(getattr(k, "key", getattr(k, "idx", k)) for k in path)
            for path, _ in jax.tree_util.tree_flatten_with_path(pure)[0]]
  assert set(leaves) == set(table), set(leaves) ^ set(table)
  for path, (theirs, to_ours, _) in table.items():
    value = to_ours(their_param(ref, theirs))
    parent = get_path(pure, path[:-1])
    assert parent[path[-1]].shape == value.shape, (path, value.shape)
    parent[path[-1]] = jnp.asarray(value, dtype)
  nnx.replace_by_pure_dict(params, pure)
  return graphdef, params, rest


def grads_in_their_names(g_params, ref: dict, prefix: str = "grad/") -> dict:
  out, pure = {}, nnx.to_pure_dict(g_params)
  for path, (theirs, _, to_theirs) in weight_map(ref["dims"]).items():
    out[f"{prefix}{theirs}"] = to_theirs(np.asarray(get_path(pure, path), np.float64))
  return out


# --- ours ------------------------------------------------------------------------------------

def regulariser_terms(aux: dict, dims: dict) -> dict:
  """Our unscaled terms per group and router, by the function `moeut_regularizer` sums."""
  n, g_count = dims["n_layers"], dims["groups"]
  return {f"reg/group{g}/{router}": moeut_reg.negative_sequence_entropy(
      [aux[f"layer{i}/{key}"] for i in range(g, n, g_count)])
          for g in range(g_count) for router, key in ROUTER_KEYS.items()}


def run_stack(ref: dict, impl: str, dtype) -> dict:
  """The block stack on x: output, logits, regulariser terms and total, the gradients of
  `sum(out * R) + reg` and of `reg` alone, in their names and layouts (float64 numpy)."""
  dims = ref["dims"]
  graphdef, params, rest = build(ref, impl, dtype)
  x, r = jnp.asarray(ref["x"], dtype), jnp.asarray(ref["r"], dtype)

  def forward(params, x):
    lm = nnx.merge(graphdef, params, rest)
    h, aux, block_reg = x, {}, jnp.zeros((), jnp.float32)
    for i, block in enumerate(lm.layer_blocks):  # as TransformerLM.hidden_states
      h, block_aux = block(h, None, None)
      block_reg = block_reg + block_aux["reg_loss"]
      aux.update({f"layer{i}/{k}": v for k, v in block_aux.items() if k != "reg_loss"})
    reg = block_reg + moeut_reg.moeut_regularizer(
        aux, lm.n_layers, lm.n_groups, ff_coef=lm.moeut_ff_reg,
        attention_coef=lm.moeut_attention_reg)
    logits = {f"logits/layer{i}/{router}": aux[f"layer{i}/{key}"]
              for i in range(dims["n_layers"]) for router, key in ROUTER_KEYS.items()}
    return h, reg, {**logits, **regulariser_terms(aux, dims)}

  def differentiated(params, x):
    out, reg, extra = forward(params, x)
    return (out, reg), extra

  @functools.partial(jax.jit, compiler_options=JIT_OPTIONS)
  def run(params, x):  # one forward, the two backward passes
    (out, reg), pullback, extra = jax.vjp(differentiated, params, x, has_aux=True)
    total_grads = pullback((r, jnp.ones_like(reg)))
    reg_grads = pullback((jnp.zeros_like(out), jnp.ones_like(reg)))
    return out, reg, extra, total_grads, reg_grads

  out, reg, extra, (g_params, g_x), (rg_params, rg_x) = run(params, x)
  assert out.dtype == dtype and g_x.dtype == dtype
  got = {"out": np.asarray(out, np.float64), "reg/total64": np.asarray(reg, np.float64),
         "grad/x": np.asarray(g_x, np.float64), "reg_grad/x": np.asarray(rg_x, np.float64)}
  got.update({k: np.asarray(v, np.float64) for k, v in extra.items()})
  got.update({k: v for k, v in grads_in_their_names(g_params, ref).items()
              if not k.startswith(("grad/embedding", "grad/out_norm", "grad/lm_head"))})
  got.update({k: v for k, v in grads_in_their_names(rg_params, ref, "reg_grad/").items()
              if k in ref})
  return got


def run_lm(ref: dict, impl: str, dtype) -> dict:
  """`lm(tokens)`: logits, the regulariser (`aux["reg_loss"]`, terms from its aux) and the
  gradients of `sum(logits * R) + reg` wrt the LM's own weights, in their names."""
  graphdef, params, rest = build(ref, impl, dtype)
  tokens = jnp.asarray(ref["lm_tokens"], jnp.int32)
  r = jnp.asarray(ref["lm_r"], dtype)

  def loss(params):
    logits, _, aux = nnx.merge(graphdef, params, rest)(tokens)
    return jnp.sum(logits * r) + aux["reg_loss"], (logits, aux["reg_loss"],
                                                   regulariser_terms(aux, ref["dims"]))

  (_, (logits, reg, terms)), g_params = jax.jit(jax.value_and_grad(loss, has_aux=True),
                                                    compiler_options=JIT_OPTIONS)(
      params)
  assert logits.dtype == dtype
  got = {"lm/out": np.asarray(logits, np.float64), "lm/reg/total64": np.asarray(reg, np.float64)}
  got.update({f"lm/{k}": np.asarray(v, np.float64) for k, v in terms.items()})
  got.update({f"lm/{k}": v for k, v in grads_in_their_names(g_params, ref).items()
              if f"lm/{k}" in ref})
  return got


def compare(got: dict, ref: dict) -> dict:
  """`max |ours - theirs| / max |theirs|` of every array (over all of it)."""
  errors = {}
  for name, value in got.items():
    want = ref[name]
    assert value.shape == want.shape, (name, value.shape, want.shape)
    errors[name] = float(np.max(np.abs(value - want)) / np.max(np.abs(want)))
  return errors


def expected_stack_arrays(ref: dict) -> set:
  return {k for k in ref if k.startswith(("grad/", "reg_grad/", "reg/group", "logits/"))} | {
      "out", "reg/total64"}


def expected_lm_arrays(ref: dict) -> set:
  return {k for k in ref if k.startswith(("lm/grad/", "lm/reg/group"))} | {
      "lm/out", "lm/reg/total64"}


def assert_within(errors: dict, rtol: float, what: str) -> None:
  bad = {k: f"{v:.2e}" for k, v in errors.items() if not v <= rtol}
  assert not bad, f"{what}: max |ours - theirs| / max |theirs| above {rtol:.0e}: {bad}"


# --- tests -----------------------------------------------------------------------------------

def test_reference_is_meaningful(ref):
  """K < E for every router, no near-tie in any top-K (so float32 rounding cannot flip a
  choice), every expert row of every expert weight reached by the gradients, repeats that
  differ (the regulariser's mean over repeats is not a mean over copies), and a regulariser
  whose gradient is not negligible at float32 tolerance."""
  dims = ref["dims"]
  assert dims["att_k"] < dims["att_e"] and dims["ff_k"] < dims["ff_e"]
  assert dims["n_layers"] // dims["groups"] >= 2
  for key, logits in ref.items():
    if key.startswith("logits/"):
      k = dims["ff_k"] if key.endswith("/ff") else dims["att_k"]
      scores = np.sort(1.0 / (1.0 + np.exp(-logits)), axis=-1)
      assert np.min(scores[..., -k] - scores[..., -k - 1]) > 1e-3, key
  for g in range(dims["groups"]):
    for name in ("attention.v", "attention.o", "attention.sel_v", "attention.sel_o",
                 "ffn.keys", "ffn.values", "ffn.expert_sel"):
      grad = ref[f"grad/layers.{g}.{name}"]
      assert np.all(np.abs(grad).reshape(grad.shape[0], -1).max(1) > 0), (g, name)
    assert np.max(np.abs(ref[f"logits/layer{g}/ff"] - ref[f"logits/layer{g + 2}/ff"])) > 0.1
  # The regulariser's gradient on the routers, relative to the whole loss's: well above
  # the float32 tolerance below.
  for name in ("attention.sel_v", "attention.sel_o", "ffn.expert_sel"):
    share = (np.max(np.abs(ref[f"reg_grad/layers.0.{name}"]))
             / np.max(np.abs(ref[f"grad/layers.0.{name}"])))
    assert share > 1e-5, (name, share)
  assert abs(float(ref["reg/total"]) / float(ref["reg/total64"]) - 1) < 1e-6
  assert str(ref["dtype"]) == "float64" and len(str(ref["authors_commit"])) == 40


@pytest.mark.parametrize("impl", IMPLS)
def test_float32_matches_authors(ref, impl):
  """float32 (the model's compute dtype) against their float64. Four layers whose residual
  grows to ~20 and whose gradients are sums of a few hundred order-one terms: float32 rounding
  (2^-24 ~ 6e-8) leaves ~1e-6 of each array's scale, and their own code run in float32 on
  these weights is 1.2e-8 to 2.0e-6 away (`max_rel_their_float32` in the npz; 2.0e-6 for
  layer 0's k gradient); ours, 1.6e-6 at most (gather and blocked alike). 2e-5: 10x that.
  The regulariser's own gradients (`reg_grad/`, ~1e-3 in size) are compared on their own
  scale, so a missing or misweighted regulariser gradient fails here even where it is small
  in the total's."""
  got = run_stack(ref, impl, jnp.float32)
  got.update(run_lm(ref, impl, jnp.float32))
  assert set(got) == expected_stack_arrays(ref) | expected_lm_arrays(ref)
  assert_within(compare(got, ref), 2e-5, impl)


def _expert_mlp_float64(x_nd, sel_nk, gates_nk, w_up_edg, w_down_egd, *, impl,
                        dropout_rate=0.0, dropout_key=None, activation=jax.nn.relu):
  """`pallas_kernels.expert_mlp` (no dropout) by gather, in the input dtype."""
  assert dropout_key is None or dropout_rate == 0
  hidden_nkg = activation(cvmm_float64(x_nd, sel_nk, w_up_edg, impl=impl))
  return cvmm_float64(hidden_nkg, sel_nk, w_down_egd, gates_nk, impl=impl)


def _negative_sequence_entropy_float64(logits_per_repeat):
  """`moeut_regularizer.negative_sequence_entropy` without its float32 cast (same formula)."""
  logits_bxe = jnp.concatenate(logits_per_repeat, axis=1)
  logp_bxe = jax.nn.log_softmax(logits_bxe, axis=-1)
  log_mean_be = jax.nn.logsumexp(logp_bxe, axis=1) - math.log(logits_bxe.shape[1])
  return jnp.mean(jnp.sum(jnp.exp(log_mean_be) * log_mean_be, axis=-1))


def test_float64_wiring_matches_authors(ref, monkeypatch):
  """float64 with the float32 helpers swapped for float64 ones (module docstring): equal to
  their float64 run up to float64 rounding (2^-53 ~ 1e-16 times the same sums, softmaxes and
  sigmoids: observed 4.2e-15 of an array's scale at most). 1e-10 leaves room for other
  summation orders and still catches any difference in the computation: our default
  LayerNorm epsilon (1e-6 instead of their 1e-5) alone moves the arrays by up to 6.7e-5."""
  monkeypatch.setattr(rotary, "apply_rotary", apply_rotary_float64)
  monkeypatch.setattr(pallas_kernels, "cvmm", cvmm_float64)
  monkeypatch.setattr(pallas_kernels, "expert_mlp", _expert_mlp_float64)
  monkeypatch.setattr(moeut_reg, "negative_sequence_entropy",
                      _negative_sequence_entropy_float64)
  with jax.enable_x64(True):
    got = run_stack(ref, "gather", jnp.float64)
    got.update(run_lm(ref, "gather", jnp.float64))
  assert set(got) == expected_stack_arrays(ref) | expected_lm_arrays(ref)
  assert_within(compare(got, ref), 1e-10, "float64")
